"""Long texts in the report, in a real headless Chromium (issue 54): a question, a prediction, a
completion and an error of megabytes each are put in the page once and cut to a preview (the table
cell at ``CELL`` characters without a tooltip copy, the episode at ``PREVIEW`` with "show all"),
so the rendered page grows by kilobytes, not by the texts' size (a 30 MB prediction made a 58 MB
page); "show all" still brings back every character."""

from __future__ import annotations

import json
import shutil

import pytest
from tests.support.chromium import Chromium, find_chromium

from memsearch.report.html import write_report

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_chromium() is None, reason="no chromium on PATH (Debian: apt-get install -y chromium; .ci/run does)"
    ),
]
MB = 1 << 20
# The rendered page: every section the script fills, not the embedded (compressed) payload.
RENDERED = ("['runbar','header','compare','controls','table','episode']"
            ".reduce((n, id) => n + document.getElementById(id).outerHTML.length, 0)")


def _rewrite(path, task_id, change) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines:
        record = json.loads(line)
        if record.get("task_id") == task_id:
            change(record)
        out.append(json.dumps(record, ensure_ascii=False))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def runs(rules_matrix, tmp_path_factory):
    """Group B as it ran, and a copy where one task's texts are megabytes long."""
    root = tmp_path_factory.mktemp("long")
    plain, huge = root / "plain", root / "huge"
    shutil.copytree(rules_matrix / "B", plain)
    shutil.copytree(rules_matrix / "B", huge)
    task_id = json.loads((huge / "metrics.jsonl").read_text().splitlines()[0])["task_id"]
    prediction = "the answer is " + "yes " * (3 * MB // 4)  # 3 MB
    question = "Which " + "very " * (MB // 5) + "long question?"  # 1 MB

    def trajectory(t):
        t["prediction"], t["question"], t["error"] = prediction, question, "server said: " + "e" * MB
        calls = [e for e in t["events"] if e["type"] == "policy_call"]
        calls[-1]["text"] = prediction

    _rewrite(huge / "metrics.jsonl", task_id, lambda row: row.update(prediction=prediction))
    _rewrite(huge / "trajectories.jsonl", task_id, trajectory)
    return plain, huge, task_id, prediction


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


def test_megabyte_texts_add_kilobytes_to_the_page(browser, runs, hotpot_dev_dir, tmp_path):
    plain, huge, task_id, prediction = runs
    sizes = {}
    for name, run in (("plain", plain), ("huge", huge)):
        report = write_report([run], hotpot_dev_dir, tmp_path / f"{name}.html")
        page = browser.open(f"{report.as_uri()}#task={task_id}")
        assert page.eval("document.querySelector('[data-testid=episode]').dataset.episodeTask") == task_id
        table = page.eval("document.getElementById('table').outerHTML.length")
        ms = page.eval(f"[window.__report.apply('task='), window.__report.apply('task={task_id}')]")
        print(f"{name}: apply table {ms[0]:.0f} ms, table + episode {ms[1]:.0f} ms")
        sizes[name] = (page.eval(RENDERED), table)
        assert page.console_errors == [] and page.eval("document.getElementById('errors').textContent") == ""
        if name == "huge":
            # The prediction's cell is cut, once, with no tooltip copy.
            cell = page.eval(f"document.querySelector('[data-task-id=\"{task_id}\"]').innerHTML")
            assert "more characters: open the task" in cell and prediction[:100] in cell
            assert len(cell) < 20_000 and "title=\"the answer is" not in cell
            # "show all" on the prediction brings back every character, once.
            full = page.eval("(() => { const b = document.querySelector('#episode .prediction button.showall');"
                             " const box = b.parentElement; b.click(); return box.textContent; })()")
            assert full == prediction
    added, added_table = sizes["huge"][0] - sizes["plain"][0], sizes["huge"][1] - sizes["plain"][1]
    print(f"rendered page (bytes of HTML, table): {sizes}")
    # 5 MB of text (prediction twice in the run: row and completion; question; error) -> kilobytes.
    assert added < 64_000, sizes
    assert added_table < 4_000, sizes
