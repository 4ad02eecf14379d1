"""``OUT/report.html`` of an experiment folder (``report.experiment``): its ``report.md`` as a page
headed by links to each matrix's view, the views being what ``memsearch report view`` writes for a
matrix folder. Built on a folder laid out as ``memsearch experiment run`` leaves it, from a real
rules matrix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memsearch.assets.samples import HOTPOT_DEV, samples_dir
from memsearch.data.dataset import save_dataset
from memsearch.data.hotpot import convert_hotpot
from memsearch.errors import InputError
from memsearch.report.experiment import markdown_html, matrix_folders, write_experiment_html
from memsearch.report.html import payload_of_html, write_report

REPORT = Path(__file__).resolve().parents[2] / "docs" / "results" / "memory_policy_cpu_v3" / "report.md"


@pytest.fixture
def experiment(rules_matrix, tmp_path):
    out = tmp_path / "exp"
    for name in ("baseline", "seed-10", "seed-2"):
        shutil.copytree(rules_matrix, out / name / "matrix")
    (out / "heldout" / "base").mkdir(parents=True)  # an eval run folder, no matrix: not linked
    (out / "report.md").write_text(REPORT.read_text(encoding="utf-8")
                                   + "\n## Experiment\n\nSee `<script>alert(1)</script>` & **this**:\n\n- one\n- two\n")
    return out


def test_the_page_links_each_matrix_view_and_shows_the_report(experiment, hotpot_dev_dir, tmp_path):
    page = write_experiment_html(experiment, hotpot_dev_dir)
    assert page == experiment / "report.html"
    text = page.read_text(encoding="utf-8")
    # the views, seeds by number, each the report `memsearch report view` writes of that matrix
    links = [f'<a href="{name}/matrix.html">{name}/matrix</a>' for name in ("baseline", "seed-2", "seed-10")]
    assert all(link in text for link in links)
    assert [text.index(link) for link in links] == sorted(text.index(link) for link in links)
    alone = write_report([experiment / "seed-2" / "matrix"], hotpot_dev_dir, tmp_path / "alone.html")
    for name in ("baseline", "seed-2", "seed-10"):
        view = (experiment / name / "matrix.html").read_text(encoding="utf-8")
        assert payload_of_html(view)["run_order"] == ["A", "B", "C", "D"]
    assert (experiment / "seed-2" / "matrix.html").read_bytes() == alone.read_bytes()
    assert not (experiment / "seed-2" / "matrix" / "report.html").exists()  # the matrix folder is left as it was
    # report.md as HTML: headings, tables, code, lists; its text escaped
    assert "<h1>Memory-policy pipeline</h1>" in text and "<h3>Seed 1</h3>" in text
    assert "<th>policy</th><th>memory support recall</th>" in text
    assert "<tr><td>base</td><td>0.010</td>" in text
    assert "<code>backends.baseline_memory</code>" in text
    assert ("<p>See <code>&lt;script&gt;alert(1)&lt;/script&gt;</code> &amp; <strong>this</strong>:</p>\n"
            "<ul>\n<li>one</li>\n<li>two</li>\n</ul>") in text
    assert "<script" not in text
    # written again whole, to the same bytes
    write_experiment_html(experiment, hotpot_dev_dir)
    assert page.read_text(encoding="utf-8") == text


def test_a_folder_without_report_md_or_on_other_data_is_refused(experiment, hotpot_dev_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(InputError, match=r"bare/report.md: missing; the experiment's report is written from it"):
        write_experiment_html(bare, hotpot_dev_dir)
    other = tmp_path / "other-data"  # the first 10 questions, not the matrices' 40
    save_dataset(convert_hotpot(samples_dir() / HOTPOT_DEV, split="dev", limit=10), other)
    with pytest.raises(InputError, match="data fingerprint differs"):
        write_experiment_html(experiment, other)
    assert not (experiment / "report.html").exists()


def test_a_folder_with_no_matrix_yet_says_so(tmp_path):
    (tmp_path / "report.md").write_text("# Memory-policy pipeline\n\n| a | b |\n|---|---|\n| `x|y` | 2 |\n")
    text = write_experiment_html(tmp_path, tmp_path).read_text(encoding="utf-8")
    assert "No finished matrix under this folder yet." in text and matrix_folders(tmp_path) == []
    assert "<tr><td><code>x|y</code></td><td>2</td></tr>" in text  # a pipe inside code stays in its cell


def test_pipes_without_a_header_rule_are_text():
    assert markdown_html("| a |\n| b |") == "<p>| a |<br>\n| b |</p>"
