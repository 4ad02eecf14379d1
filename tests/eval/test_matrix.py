"""Matrix groups: summary groups A/C write memory with the baseline memory backend, never with
the trained memory policy of B/D, and every group's summary says which backend wrote its memory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.config import group_config, load_config
from memsearch.errors import InputError
from memsearch.eval.matrix import run_matrix

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"


def _memory(cfg) -> tuple:
    m = cfg.backends.memory
    identity = m.recorded_identity()  # None where the kind has no adapter; 'embedded' where it has no model
    return m.kind, identity["model"], identity["adapter"]


def test_summary_groups_drop_the_trained_adapter_by_default():
    cfg = load_config(RULES, ['backends.memory.kind="hf"', 'backends.memory.adapter="runs/stage1/adapter"'])
    assert cfg.backends.baseline_memory is None
    groups = {g: group_config(cfg, g) for g in "ABCD"}
    assert _memory(groups["B"]) == _memory(groups["D"]) == ("hf", "embedded", "runs/stage1/adapter")
    assert _memory(groups["A"]) == _memory(groups["C"]) == ("hf", "embedded", None)
    # everything else about the memory backend is the run's own
    assert groups["A"].backends.memory.sampling == cfg.backends.memory.sampling


def test_summary_groups_take_the_base_of_a_merged_checkpoint(tmp_path):
    """A stage-1 policy served merged (``memsearch merge-adapter`` records its base) is not the
    baseline either: A/C use the recorded base model."""
    merged = tmp_path / "stage1-merged"
    merged.mkdir()
    (merged / "memsearch_merge.json").write_text(json.dumps({"base": "embedded", "adapter": "runs/stage1/adapter"}))
    cfg = load_config(RULES, ['backends.memory.kind="hf"', f"backends.memory.model={json.dumps(str(merged))}"])
    assert _memory(group_config(cfg, "B")) == ("hf", str(merged), None)
    assert _memory(group_config(cfg, "A")) == ("hf", "embedded", None)


def test_baseline_memory_is_used_by_summary_groups_and_group_overrides_still_win():
    cfg = load_config(RULES, ['backends.memory.kind="hf"', 'backends.memory.adapter="runs/stage1/adapter"',
                              'backends.baseline_memory={kind="openai", model="base-7b", '
                              'base_url="http://127.0.0.1:8000/v1"}',
                              'matrix.overrides.C={"backends.memory.model" = "other-7b"}'])
    assert _memory(group_config(cfg, "A")) == ("openai", "base-7b", None)
    assert _memory(group_config(cfg, "C")) == ("openai", "other-7b", None)  # the group's own override is applied last
    assert _memory(group_config(cfg, "B")) == ("hf", "embedded", "runs/stage1/adapter")


def test_matrix_summaries_record_which_backend_wrote_the_memory(hotpot_dev_dir, tiny_model_dir, tmp_path):
    """A real run: B/D's memory is a (tiny, real) hf model, A/C's the rules baseline; each
    group's summary, matrix.json and matrix.md name the backend that wrote its memory."""
    model = json.dumps(str(tiny_model_dir))
    cfg = load_config(RULES, ["limit=2", 'matrix.groups=["A", "B"]', 'backends.memory.kind="hf"',
                              f"backends.memory.model={model}", "budgets.policy_tokens=8",
                              'backends.baseline_memory={kind="rules"}'])
    out = tmp_path / "matrix"
    result = run_matrix(cfg, hotpot_dev_dir, out, show_progress=False)
    summaries = {g: json.loads((out / g / "summary.json").read_text()) for g in "AB"}
    local = {"adapter": None, "base_url": None, "served_identity": None}
    assert summaries["A"]["memory_backend"] == {"kind": "rules", "model": "embedded", "name": "rules", **local}
    assert summaries["B"]["memory_backend"] == {"kind": "hf", "model": str(tiny_model_dir), "name": "hf", **local}
    assert summaries["A"]["backends"]["memory"] == "rules" and summaries["B"]["backends"]["memory"] == "hf"
    for g in "AB":
        assert result["groups"][g]["memory_backend"] == summaries[g]["memory_backend"]
        # every memory call of the group was answered by that backend (rules reports no usage, hf its own)
        calls = [json.loads(line) for line in (out / g / "trajectories.jsonl").read_text().splitlines()]
        memory_calls = [e for t in calls for e in t["events"] if e["type"] == "policy_call" and e["role"] == "memory"]
        assert memory_calls and {e["usage"]["source"] for e in memory_calls} == ({"none"} if g == "A" else {"reported"})
    table = (out / "matrix.md").read_text()
    assert (
        "| A | summary | fixed | rules |" in table and f"| B | decision | fixed | hf:{tiny_model_dir.name} |" in table
    )
    # Said once, after the table, and only what applies: B's memory policy is an untrained model
    # (no C, so no cross-ablation; nothing trained, so no teacher-set caveat).
    assert result["caveats"] == [
        "B: no trained policy (base model or rules: no adapter, no merged checkpoint) answers the policy calls: "
        "prompt baseline(s), not RL results.",
        "Retrieval is candidate-scope (each task's own candidate paragraphs): not open-domain full-wiki retrieval.",
    ]
    assert table.endswith("Caveats:\n" + "".join(f"- {c}\n" for c in result["caveats"]))
    assert table.count("Caveats:") == 1 and result["table"] == table


def test_baseline_memory_must_be_a_backend_table():
    with pytest.raises(Exception, match="baseline_memory"):
        load_config(RULES, ['backends.baseline_memory="embedded"'])


def _toml(tmp_path: Path, text: str) -> Path:
    """configs/rules.toml with ``text`` appended: a real config file."""
    path = tmp_path / "matrix.toml"
    path.write_text(RULES.read_text(encoding="utf-8") + "\n" + text, encoding="utf-8")
    return path


# One override in each form TOML allows: a sub-table, dotted keys, a quoted dotted key. (A field the
# rules backend reads: a key of another kind on a rules backend is refused, tests/config.)
FORMS = {
    "sub-table": '[matrix.overrides.B.backends.memory.sampling]\nseed = 3\n',
    "dotted keys": '[matrix.overrides.B]\nbackends.memory.sampling.seed = 3\n',
    "quoted dotted key": '[matrix.overrides.B]\n"backends.memory.sampling.seed" = 3\n',
    "inline table": '[matrix.overrides]\nB = {backends = {memory = {sampling = {seed = 3}}}}\n',
}


@pytest.mark.parametrize("form", FORMS)
def test_an_override_means_the_same_in_every_toml_form(tmp_path, form):
    cfg = load_config(_toml(tmp_path, FORMS[form]))
    assert cfg.matrix.overrides == {"B": {"backends.memory.sampling.seed": 3}}  # recorded in one form
    assert group_config(cfg, "B").backends.memory.sampling.seed == 3
    assert group_config(cfg, "D").backends.memory.sampling.seed == 0


@pytest.mark.parametrize("text, problem", [
    ('[matrix.overrides.b]\n"backends.memory.adapter" = "x"\n',
     "matrix.overrides.b: no such group; expected A, B, C or D (upper case)"),
    ('[matrix.overrides.Q.budgets]\nmax_searches = 2\n', "matrix.overrides.Q: no such group"),
    ('[matrix.overrides.B.backends.memory]\nkind = "nosuch"\n',
     "matrix.overrides.B.backends.memory.kind: unknown backend kind 'nosuch'; registered: 'rules', 'hf', 'openai' "
     "or 'oracle'"),
    ('[matrix.overrides.B.backends.memory]\nnosuch = 1\n', "matrix.overrides.B.backends.memory.nosuch: unknown field"),
    ('[matrix.overrides.B]\n"backends.memory.kind" = "hf"\nbackends.memory.kind = "rules"\n',
     "matrix.overrides.B.backends.memory.kind: given twice"),
    ('[matrix.overrides.B.budgets]\nmemory_tokens = 128\n',
     "matrix.overrides.B.budgets: budgets, tokenizer and retrieval are identical across groups"),
    ('[matrix.overrides.D]\ntokenizer = "embedded"\n', "matrix.overrides.D.tokenizer: budgets, tokenizer and"),
    ('[matrix.overrides.B.agent]\nmemory = "summary"\n',
     "matrix.overrides.B.agent.memory: the group sets it (B: decision memory, fixed controller)"),
    ('[matrix.overrides.A.agent]\nevidence = "stream"\n', "matrix.overrides.A.agent: evidence 'stream' reads every"),
    ('[matrix.overrides.A.matrix]\ngroups = ["A"]\n', "matrix.overrides.A.matrix: a group's overrides cannot"),
    ('[matrix.overrides.C.backends.baseline_memory]\nkind = "oracle"\n',
     "matrix.overrides.C.backends.baseline_memory: set once for the summary groups, outside [matrix]"),
    ('[matrix]\ngroups = ["A", "B", "A"]\n', "matrix.groups: A given twice"),
    ('[matrix]\ngroups = []\n', "matrix.groups: List should have at least 1 item"),
])
def test_a_bad_matrix_setting_is_refused_at_load_naming_file_and_key(tmp_path, text, problem):
    path = _toml(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {problem}"), str(info.value)


def test_a_bad_override_given_with_set_is_blamed_on_that_set():
    override = 'matrix.overrides.B.backends.memory.kind="nosuch"'
    with pytest.raises(InputError) as info:
        load_config(RULES, [override])
    assert str(info.value).startswith(
        f"--set {override}: matrix.overrides.B.backends.memory.kind: unknown backend kind")


def test_overrides_of_a_streaming_config_are_refused(tmp_path):
    path = tmp_path / "stream.toml"
    path.write_text('[agent]\nevidence = "stream"\nmemory = "overwrite"\ncontroller = "exhaust"\n'
                    '[matrix.overrides.B]\nlimit = 2\n', encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: matrix.overrides: the A-D matrix runs "):
        load_config(path)


def test_the_matrix_of_a_streaming_config_is_refused_naming_the_key(tmp_path):
    from memsearch.pipelines.config import load_run_config

    with pytest.raises(InputError, match=r"^agent.evidence = 'stream': the A-D matrix"):
        run_matrix(load_run_config(ROOT / "configs" / "memagent.toml"), tmp_path / "data", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_the_matrix_command_refuses_a_group_that_does_not_exist_with_exit_2(tmp_path, hotpot_dev_dir):
    """Through the real CLI: nothing runs (the ablation must not silently run as the control)."""
    path = _toml(tmp_path, '[matrix.overrides.b]\n"backends.memory.adapter" = "x"\n')
    run = CliRunner().invoke(app, ["eval", "matrix", "--config", str(path), "--data", str(hotpot_dev_dir),
                                   "--out", str(tmp_path / "m"), "--limit", "1"])
    assert run.exit_code == 2, run.output
    assert run.stderr == f"error: {path}: matrix.overrides.b: no such group; expected A, B, C or D (upper case)\n"
    assert not (tmp_path / "m").exists()


def test_a_matrix_resumes_with_other_bootstrap_resamples_but_not_with_other_budgets(hotpot_dev_dir, tmp_path):
    # The resamples are used after every group ran: a resume may correct them (a bad value is
    # refused at load, tests/cli/test_config_problems.py); a setting the groups ran under may not change.
    out = tmp_path / "m"
    first = run_matrix(load_config(RULES, ["limit=3", "matrix.groups=['A', 'B']", "matrix.bootstrap_resamples=100"]),
                       hotpot_dev_dir, out, show_progress=False)
    again = run_matrix(load_config(RULES, ["limit=3", "matrix.groups=['A', 'B']", "matrix.bootstrap_resamples=300"]),
                       hotpot_dev_dir, out, resume=True, show_progress=False)
    assert again["groups"] == first["groups"] and again["pairs"][0]["f1"]["n"] == 3
    with pytest.raises(InputError, match=r"config differs from the run being resumed"):
        run_matrix(load_config(RULES, ["limit=3", "matrix.groups=['A', 'B']", "budgets.max_searches=1"]),
                   hotpot_dev_dir, out, resume=True, show_progress=False)


def test_a_served_memory_without_baseline_memory_is_refused_before_anything_runs(tmp_path, hotpot_dev_dir):
    """A live matrix showed openai:stage1 in all four groups: A/C summarised with the served
    trained model, silently. A served model cannot be traced to its base: the matrix refuses."""
    served = 'backends.memory={kind="openai", base_url="http://127.0.0.1:9/v1", model="stage1"}'
    cfg = load_config(RULES, ["limit=1", served])
    with pytest.raises(InputError, match=r"^backends.memory is a served model \('stage1' at http://127.0.0.1:9/v1\) "
                                         r"and backends.baseline_memory is unset: .* set backends.baseline_memory"):
        run_matrix(cfg, hotpot_dev_dir, tmp_path / "m", show_progress=False)
    assert not (tmp_path / "m").exists()
    run = CliRunner().invoke(app, ["eval", "matrix", "--config", str(RULES), "--data", str(hotpot_dev_dir),
                                   "--out", str(tmp_path / "m"), "--limit", "1", "--set", served])
    assert run.exit_code == 2 and "set backends.baseline_memory" in run.stderr and not (tmp_path / "m").exists()
    # Groups without summary memory need no baseline.
    assert _memory(group_config(cfg, "B")) == ("openai", "stage1", None)


def test_a_served_stage1_writes_b_d_memory_and_the_original_model_a_c(hotpot_dev_dir, tmp_path):
    """Two real servers: the 'original' model answers every role and A/C's memory
    (backends.baseline_memory), the 'stage 1' model only B/D's memory. The stage-1 server sees
    exactly B/D's memory calls, and every record names the backend that summarised."""
    from memsearch.testing.agent_server import AgentServer

    with AgentServer(delay_s=0.0) as base, AgentServer(delay_s=0.0) as stage1:
        def backend(server, model):
            return f'{{kind="openai", base_url="{server.base_url}", model="{model}"}}'
        cfg = load_config(ROOT / "configs" / "api.toml", [
            'tokenizer="lexical"', "limit=2", 'agent.controller="fixed"',
            f"backends.memory={backend(stage1, 'stage1')}", f"backends.baseline_memory={backend(base, 'base')}",
            *[f'backends.{r}.base_url="{base.base_url}"' for r in ("controller", "reader")]])
        out = tmp_path / "m"
        result = run_matrix(cfg, hotpot_dev_dir, out, show_progress=False)
    memory_calls = {}
    for g in "ABCD":
        trajs = [json.loads(line) for line in (out / g / "trajectories.jsonl").read_text().splitlines()]
        calls = [e for t in trajs for e in t["events"] if e["type"] == "policy_call"]
        memory_calls[g] = sum(1 for e in calls if e["role"] == "memory")
        want = ("stage1", stage1.base_url) if g in "BD" else ("base", base.base_url)
        summary = json.loads((out / g / "summary.json").read_text())
        assert (summary["memory_backend"]["model"], summary["memory_backend"]["base_url"]) == want
        assert result["groups"][g]["memory_backend"] == summary["memory_backend"]
    assert stage1.requests == memory_calls["B"] + memory_calls["D"] > 0 and memory_calls["A"] > 0
    table = result["table"]
    assert f"| A | summary | fixed | openai:base@127.0.0.1:{base.port} |" in table
    assert f"| B | decision | fixed | openai:stage1@127.0.0.1:{stage1.port} |" in table
    # Served models memsearch cannot trace: B, C, D are said to be prompt baselines unless trained.
    assert result["caveats"][0].startswith("B, C, D: the policy is a served model memsearch cannot trace to training")
