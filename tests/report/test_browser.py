"""The report in a real headless Chromium (Debian's ``chromium``, driven over the DevTools pipe by
``tests/support/chromium.py``): the test contract's counts per filter equal those computed from
metrics.jsonl, the episode view shows the memory diff and highlighted gold facts, compare mode's
regression count is right, the training view draws its charts, and no console error occurs.

Set ``MEMSEARCH_SCREENSHOTS=docs/images`` to also write the README's screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from tests.support.chromium import Chromium, find_chromium

from memsearch.io import iter_jsonl
from memsearch.report.html import write_report

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_chromium() is None, reason="no chromium on PATH (Debian: apt-get install -y chromium; .ci/run does)"
    ),
]
TRAIN_LOG = Path(__file__).resolve().parents[2] / "docs" / "results" / "cpu_grpo_train_log.jsonl"
COUNT = "document.querySelector('[data-testid=task-count]').textContent"


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


def _shot(page, name: str) -> None:
    folder = os.environ.get("MEMSEARCH_SCREENSHOTS")
    if folder:
        page.screenshot(Path(folder) / f"report-{name}.png")


def _texts(rows, data_dir, run_dir):
    """(row, question, gold) per metrics row: what the page's free-text search reads."""
    gold = {r["id"]: r["answers"][0] for _, r in iter_jsonl(data_dir / "labels.jsonl")}
    question = {t["task_id"]: t["question"] for _, t in iter_jsonl(run_dir / "trajectories.jsonl")}
    return [(r, question[r["task_id"]], gold[r["task_id"]]) for r in rows]


def _clean(page) -> None:
    assert page.console_errors == []
    assert page.eval("document.getElementById('errors').textContent") == ""


def test_filter_counts_match_metrics(browser, rules_matrix, hotpot_dev_dir, tmp_path):
    report = write_report([rules_matrix], hotpot_dev_dir, tmp_path / "m.html", [TRAIN_LOG])
    for group in ("A", "D"):
        rows = [r for _, r in iter_jsonl(rules_matrix / group / "metrics.jsonl")]
        expected = {
            "correct": sum(r["em"] == 1 for r in rows),
            "incorrect": sum(r["em"] == 0 for r in rows),
            "error": sum(r["status"] != "ok" for r in rows),
            "all": len(rows),
            "invalid": sum(r["invalid_actions"] > 0 for r in rows),
            "truncated": sum(r["memory_truncations"] > 0 or r["chunks_cut"] > 0 for r in rows),
        }
        for name, n in expected.items():
            page = browser.open(f"{report.as_uri()}#run={group}&filter={name}")
            assert int(page.eval(COUNT)) == n, (group, name)
            visible = page.eval("[...document.querySelectorAll('[data-task-id]')].map(e => e.dataset.taskId)")
            # The list is windowed: the first rows are drawn, each carrying its id, in metrics order.
            if name in ("all", "correct", "incorrect"):
                wanted = [r["task_id"] for r in rows if name == "all" or r["em"] == (name == "correct")]
                assert visible == wanted[: len(visible)] and 0 < len(visible) <= len(wanted)
            _clean(page)
        # The run's caveats, once, outside the collapsed header details (D: rules policies).
        summary = json.loads((rules_matrix / group / "summary.json").read_text())
        caveats = "[...document.querySelectorAll('#header [data-testid=caveats] li')].map(e => e.textContent)"
        assert page.eval(caveats) == summary["caveats"] and len(summary["caveats"]) == (1 if group == "A" else 2)
    rows = [r for _, r in iter_jsonl(rules_matrix / "A" / "metrics.jsonl")]
    # Sorting (F1, descending) and free-text search, both from the hash.
    page = browser.open(f"{report.as_uri()}#run=A&sort=f1&dir=-1")
    top = page.eval("[...document.querySelectorAll('[data-task-id]')].slice(0, 3).map(e => e.dataset.taskId)")
    assert top == [r["task_id"] for r in sorted(rows, key=lambda r: -r["f1"])][:3]
    word = rows[0]["prediction"].split()[0]
    page = browser.open(f"{report.as_uri()}#run=A&q={word}")
    expected = sum(
        word.lower() in "\x01".join(str(x) for x in (r["task_id"], q, lab, r["prediction"])).lower()
        for r, q, lab in _texts(rows, hotpot_dev_dir, rules_matrix / "A")
    )
    assert int(page.eval(COUNT)) == expected >= 1
    page = browser.open(f"{report.as_uri()}#run=A&filter=incorrect")
    _shot(page, "tasks")
    page = browser.open(f"{report.as_uri()}#view=training")
    assert page.eval("document.querySelectorAll('[data-testid=chart]').length") >= 6
    _shot(page, "training")
    _clean(page)


def test_episode_shows_memory_diff_and_gold_facts(browser, rules_matrix, hotpot_dev_dir, tmp_path):
    report = write_report([rules_matrix], hotpot_dev_dir, tmp_path / "m.html")
    labels = {r["id"]: r for _, r in iter_jsonl(hotpot_dev_dir / "labels.jsonl")}
    # A task whose final memory cites a gold fact: it must be highlighted in evidence and memory.
    traj = next(
        t
        for _, t in iter_jsonl(rules_matrix / "B" / "trajectories.jsonl")
        if set(t["memory_sources"]) & set(labels[t["task_id"]]["supporting_facts"])
    )
    gold = set(labels[traj["task_id"]]["supporting_facts"])
    page = browser.open(f"{report.as_uri()}#run=B&vs=-&task={traj['task_id']}")
    assert page.eval("document.querySelector('[data-testid=episode]').dataset.episodeTask") == traj["task_id"]
    added = page.eval("[...document.querySelectorAll('[data-testid=memory-diff] .add')].map(e => e.textContent)")
    assert added and any(line.strip("+ ").strip() in traj["memory_final"] for line in added)
    marked = set(page.eval("[...document.querySelectorAll('#episode mark.gold')].map(e => e.textContent)"))
    assert marked and marked <= gold
    assert page.eval("document.querySelectorAll('#episode li.gold').length") >= 1  # gold sentences shown as evidence
    assert page.eval("document.querySelectorAll('[data-testid=memory-diff] mark.gold').length") >= 1
    # No silent truncation: long prompts are collapsed, and "show all" brings back every character.
    prompts = {m["content"] for e in traj["events"] if e["type"] == "policy_call" for m in e["messages"]}
    count, full = page.eval(
        "(() => { const b = [...document.querySelectorAll('#episode button.showall')];"
        " const box = b[0].parentElement; b[0].click(); return [b.length, box.textContent]; })()"
    )
    assert count >= 1 and len(full) > 1500 and full in prompts
    page.eval("document.getElementById('episode').scrollIntoView()", await_promise=False)
    _shot(page, "episode")
    _clean(page)


def test_compare_mode_regressions(browser, rules_matrix, short_memory_run, hotpot_dev_dir, tmp_path):
    report = write_report([rules_matrix / "B", short_memory_run], hotpot_dev_dir, tmp_path / "c.html")
    a = {r["task_id"]: r["em"] for _, r in iter_jsonl(rules_matrix / "B" / "metrics.jsonl")}
    b = {r["task_id"]: r["em"] for _, r in iter_jsonl(short_memory_run / "metrics.jsonl")}
    regressions = [t for t in a if a[t] == 1 and b[t] == 0]
    improvements = [t for t in a if a[t] == 0 and b[t] == 1]
    page = browser.open(f"{report.as_uri()}#filter=regressions")
    assert int(page.eval(COUNT)) == len(regressions) > 0
    assert int(page.eval("document.querySelector('[data-testid=regression-count]').textContent")) == len(regressions)
    assert page.eval("[...document.querySelectorAll('[data-task-id]')].map(e => e.dataset.taskId)") == regressions
    page.eval(f"window.__report.apply('filter=regressions&task={regressions[0]}')")
    _shot(page, "compare")
    assert page.eval("window.__report.apply('filter=improvements'), " + COUNT) == str(len(improvements))
    _clean(page)


HEADER_RUN = "document.querySelector('#header summary b').textContent"
ROWS_OUTSIDE_TABLE = "[...document.querySelectorAll('[data-task-id]')].filter(e => !e.closest('#table')).length"


def test_hostile_run_names_render_as_text(browser, rules_matrix, hotpot_dev_dir, tmp_path):
    """Run folders named like the template's placeholders, HTML, and Object.prototype members are
    shown as their names: no task rows in the header, search and run selection still work."""
    hostile = tmp_path / "__JS__ __PAYLOAD__ __CSS__ __TITLE__ <img src=x onerror=alert(1)>&x=1#y'\"\\1"
    shutil.copytree(rules_matrix / "B", hostile)
    proto = tmp_path / "__proto__"
    shutil.copytree(rules_matrix / "D", proto)
    report = write_report([hostile, proto], hotpot_dev_dir, tmp_path / "h.html")
    rows = [r for _, r in iter_jsonl(rules_matrix / "B" / "metrics.jsonl")]
    page = browser.open(report.as_uri())
    title = f"{hostile.name} vs __proto__"
    assert page.eval("document.title") == title
    assert page.eval("document.getElementById('title').textContent") == title
    assert page.eval(ROWS_OUTSIDE_TABLE) == 0
    assert page.eval("[...document.querySelectorAll('#runsel option')].map(o => o.textContent)") == [
        hostile.name, "__proto__"]
    assert page.eval(HEADER_RUN) == hostile.name
    assert int(page.eval(COUNT)) == len(rows)
    page.eval(f"window.__report.apply('q={rows[3]['task_id']}')")
    assert int(page.eval(COUNT)) == 1
    assert page.eval("[...document.querySelectorAll('#table [data-task-id]')].map(e => e.dataset.taskId)") == [
        rows[3]["task_id"]]
    # The run named __proto__ is a run like any other, selected from the hash and from the list.
    page = browser.open(f"{report.as_uri()}#run=__proto__&vs=-")
    assert page.eval(HEADER_RUN) == "__proto__"
    page.eval("(() => { const s = document.getElementById('runsel'); s.selectedIndex = 0;"
              " s.dispatchEvent(new Event('change')); })()")
    assert page.eval("new Promise((ok) => setTimeout(() => ok(" + HEADER_RUN + "), 50))") == hostile.name
    _clean(page)


@pytest.mark.parametrize("key", ["__proto__", "constructor", "toString", "hasOwnProperty", "valueOf"])
def test_hash_keys_naming_object_members(browser, rules_matrix, hotpot_dev_dir, tmp_path_factory, key):
    """A hash naming Object.prototype members (as a run, the compared run, a task, a sort key or a
    state key) falls back like any unknown name, with no page error."""
    report = tmp_path_factory.getbasetemp() / "object-members.html"
    if not report.exists():
        write_report([rules_matrix / "B"], hotpot_dev_dir, report)
    rows = [r for _, r in iter_jsonl(rules_matrix / "B" / "metrics.jsonl")]
    page = browser.open(f"{report.as_uri()}#run={key}")
    assert page.eval(HEADER_RUN) == "B" and int(page.eval(COUNT)) == len(rows)
    _clean(page)
    page = browser.open(f"{report.as_uri()}#run=B&vs={key}&task={key}&sort={key}&{key}=1")
    assert page.eval(HEADER_RUN) == "B" and int(page.eval(COUNT)) == len(rows)
    assert page.eval("document.querySelector('[data-testid=episode]').dataset.episodeTask") == key
    assert page.eval("document.querySelector('#episode .muted').textContent") == (
        f"this run has no episode for task {key}")
    visible = page.eval("[...document.querySelectorAll('[data-task-id]')].map(e => e.dataset.taskId)")
    assert visible == [r["task_id"] for r in rows][: len(visible)]  # unknown sort key: metrics order
    _clean(page)
