"""Run-config problems, refused at load through the real CLI (issue 54): exit status 2, ``error:``
lines naming the file (or the ``--set`` flag) and the field, no traceback, no output folder.
Each class is checked on generated variants:

- a NaN or infinite number in any float field (``sampling.temperature = inf`` used to reach
  config.json as a bare ``Infinity``);
- ``matrix.bootstrap_resamples`` above its documented maximum (it used to fail after every group
  had run);
- a tokenizer that is empty, a file, or a folder without tokenizer files (``"/etc"``);
- several problems in one config: all reported in one run, not one per run;
- a ``--set`` value with a line break (TOML read the first line and dropped the rest);
- ``adapter`` / ``base_url`` / a missing ``model`` path on a ``rules`` or ``oracle`` backend,
  which runs no model (they used to be ignored without a word).
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from memsearch.cli.app import app
from memsearch.config import MAX_BOOTSTRAP_RESAMPLES, BackendConfig, RunConfig, load_config
from memsearch.errors import InputError
from memsearch.registry import BACKEND_KINDS, backend_settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "rules.toml"
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _float_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of every float field of ``model`` and the models it holds; a backend table's
    are those of every kind's settings (``BACKEND_OF``: the kind a path's table must name)."""
    paths = []
    for name, field in model.model_fields.items():
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        if float in kinds:
            paths.append(f"{prefix}{name}")
        for kind in kinds:
            if kind is BackendConfig:
                paths += _float_fields(BackendConfig, f"{prefix}{name}.")  # every kind's
                for backend in BACKEND_KINDS.names():
                    own = [p for p in _float_fields(backend_settings(backend), f"{prefix}{name}.") if p not in paths]
                    BACKEND_OF.update(dict.fromkeys(own, (f"{prefix}{name}", backend)))
                    paths += own
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                paths += _float_fields(kind, f"{prefix}{name}.")
    return paths


BACKEND_OF: dict[str, tuple[str, str]] = {}
FLOAT_FIELDS = _float_fields(RunConfig)


def _refused(args: list, out: Path):
    """Run ``eval run`` (or ``matrix`` when args say so) and check the refusal; returns stderr."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stderr.startswith("error: "), result.stderr
    assert not out.exists()
    return result.stderr


def _eval(config: Path, out: Path, data: Path, *sets: str, command: str = "run") -> list:
    return ["eval", command, "--config", config, "--data", data, "--out", out,
            *[a for s in sets for a in ("--set", s)]]


def _as_table(dotted: str, value: str) -> str:
    *tables, key = dotted.split(".")
    kind = f'kind = "{BACKEND_OF[dotted][1]}"\n' if dotted in BACKEND_OF else ""
    return (f"[{'.'.join(tables)}]\n" if tables else "") + kind + f"{key} = {value}\n"


def test_every_float_field_of_a_run_config_is_found():
    assert {"backends.memory.sampling.temperature", "backends.reader.timeout_s", "backends.controller.sampling.top_p",
            "backends.baseline_memory.timeout_s"} <= set(FLOAT_FIELDS)


@SETTINGS
@given(field=st.sampled_from(FLOAT_FIELDS), value=st.sampled_from(["inf", "-inf", "+inf", "nan", "-nan"]),
       where=st.sampled_from(["file", "--set"]), command=st.sampled_from(["run", "matrix"]))
def test_a_non_finite_number_is_refused_in_every_float_field(hotpot_dev_dir, tmp_path, field, value, where, command):
    out = tmp_path / "out"
    if where == "file":
        config = tmp_path / "run.toml"  # the field's table alone: every other setting at its default
        config.write_text(_as_table(field, value), encoding="utf-8")
        stderr = _refused(_eval(config, out, hotpot_dev_dir, command=command), out)
        assert stderr.startswith(f"error: {config}: {field}: Input should be a finite number")
    else:
        kind = [f'{BACKEND_OF[field][0]}.kind="{BACKEND_OF[field][1]}"'] if field in BACKEND_OF else []
        stderr = _refused(_eval(RULES, out, hotpot_dev_dir, *kind, f"{field}={value}", command=command), out)
        assert stderr.startswith(f"error: --set {field}={value}: {field}: Input should be a finite number")


@SETTINGS
@given(resamples=st.one_of(st.integers(MAX_BOOTSTRAP_RESAMPLES + 1, 2**63 - 1), st.integers(-(2**63), 99)))
def test_bootstrap_resamples_out_of_bounds_are_refused_at_load(hotpot_dev_dir, tmp_path, resamples):
    out = tmp_path / "matrix"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, f"matrix.bootstrap_resamples={resamples}", command="matrix"),
                      out)
    bound = f"less than or equal to {MAX_BOOTSTRAP_RESAMPLES}" if resamples > MAX_BOOTSTRAP_RESAMPLES else \
        "greater than or equal to 100"
    assert stderr == f"error: --set matrix.bootstrap_resamples={resamples}: matrix.bootstrap_resamples: Input should " \
                     f"be {bound}\n"


def test_the_largest_bootstrap_resamples_is_accepted():
    assert load_config(RULES, [f"matrix.bootstrap_resamples={MAX_BOOTSTRAP_RESAMPLES}"]).matrix.bootstrap_resamples \
        == MAX_BOOTSTRAP_RESAMPLES


@pytest.mark.parametrize("kind", ["empty", "blank", "a file", "a folder of other files", "the system's /etc"])
def test_a_tokenizer_that_is_none_is_refused_at_load(hotpot_dev_dir, tmp_path, kind):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}\n")
    (tmp_path / "vocab.txt").write_text("a\n")
    spec = {"empty": "", "blank": "  ", "a file": str(tmp_path / "vocab.txt"), "a folder of other files": str(other),
            "the system's /etc": "/etc"}[kind]
    out = tmp_path / "run"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, f"tokenizer={json.dumps(spec)}"), out)
    assert stderr.startswith(f"error: --set tokenizer={json.dumps(spec)}: tokenizer: ")
    assert "expected 'embedded' or 'lexical' or a local Hugging Face tokenizer folder" in stderr


def test_a_missing_tokenizer_folder_is_refused_before_the_run_starts(hotpot_dev_dir, tmp_path):
    out = tmp_path / "run"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, f"tokenizer={json.dumps(str(tmp_path / 'gone'))}"), out)
    assert stderr.startswith(f"error: tokenizer: '{tmp_path / 'gone'}': no such folder")


# Problems each found where pydantic validates the field or the table that holds it (so all of
# them in the same pass; pydantic runs a table's checks only once its own fields are valid, so no
# check here shares a table with a field problem): (--set, the field the refusal names).
FIELD_PROBLEMS = [
    ("budgets.max_searches=0", "budgets.max_searches"),
    ("concurrency=0", "concurrency"),
    ("backends.memory.sampling.temperature=inf", "backends.memory.sampling.temperature"),
    ('tokenizer=""', "tokenizer"),
    ('prompts.overwrite_update="{x}"', "prompts.overwrite_update"),
    ('prompts.overwrite_final="{y}"', "prompts.overwrite_final"),
    ('backends.reader.adapter="runs/none"', "backends.reader.adapter"),
    ('backends.controller.base_url="http://127.0.0.1:9/v1"', "backends.controller.base_url"),
    ("backends.reader.open_items=true", "backends.reader.open_items"),  # two checks of one table
    ('matrix.groups=["A", "A"]', "matrix.groups"),
    ("matrix.bootstrap_resamples=9223372036854775807", "matrix.bootstrap_resamples"),
]
# Problems of the run config as a whole (its checks across tables, run once its fields are valid).
WHOLE_PROBLEMS = [
    (['agent.memory_format="extractive"', 'agent.memory="summary"'], "agent.memory_format"),
    (['agent.controller="exhaust"'], "agent"),
    (['backends.memory.schema_mode=true'], "backends.memory.schema_mode"),
]


@SETTINGS
@given(chosen=st.lists(st.sampled_from(FIELD_PROBLEMS), min_size=2, max_size=len(FIELD_PROBLEMS), unique=True))
def test_every_problem_of_the_fields_is_reported_in_one_run(hotpot_dev_dir, tmp_path, chosen):
    out = tmp_path / "run"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, *[s for s, _ in chosen]), out)
    for setting, field in chosen:
        assert f"error: --set {setting}: {field}: " in stderr, (setting, stderr)


@SETTINGS
@given(chosen=st.lists(st.sampled_from(WHOLE_PROBLEMS), min_size=2, max_size=len(WHOLE_PROBLEMS),
                       unique_by=lambda p: p[1]))
def test_every_problem_across_tables_is_reported_in_one_run(hotpot_dev_dir, tmp_path, chosen):
    out = tmp_path / "run"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, *[s for sets, _ in chosen for s in sets]), out)
    for _, field in chosen:
        assert f": {field}: " in stderr, (field, stderr)
    assert len(stderr.splitlines()) >= len(chosen)


@SETTINGS
@given(before=st.text(alphabet="0123456789", max_size=3), after=st.text(max_size=12),
       brk=st.sampled_from(["\n", "\r", "\r\n"]), key=st.sampled_from(["budgets.max_searches", "tokenizer", "limit"]))
def test_a_set_value_with_a_line_break_is_refused_naming_the_flag(hotpot_dev_dir, tmp_path, before, after, brk, key):
    out = tmp_path / "run"
    flag = f"{key}={before}{brk}{after}"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, flag), out)
    assert stderr.startswith(f"error: --set {flag!r}: holds a line break; expected one key=value on one line")


@SETTINGS
@given(kind=st.sampled_from(["rules", "oracle"]), role=st.sampled_from(["memory", "controller", "reader"]),
       fields=st.lists(st.sampled_from(["adapter", "base_url", "model"]), min_size=1, max_size=3, unique=True))
def test_a_model_setting_of_a_backend_that_runs_no_model_is_refused(hotpot_dev_dir, tmp_path, kind, role, fields):
    values = {"adapter": str(tmp_path / "adapter"), "base_url": "http://127.0.0.1:9/v1", "model": str(tmp_path / "m")}
    sets = [f'backends.{role}.kind="{kind}"', *[f"backends.{role}.{f}={json.dumps(values[f])}" for f in fields]]
    out = tmp_path / "run"
    stderr = _refused(_eval(RULES, out, hotpot_dev_dir, *sets), out)
    for field in fields:
        flag = next(s for s in sets if s.startswith(f"backends.{role}.{field}="))
        assert f"error: --set {flag}: backends.{role}.{field}: kind '{kind}' runs no model, so {field} is never read" \
            in stderr


def test_a_rules_role_lets_the_unset_model_be_and_refuses_a_folder_there_or_not(tmp_path):
    # 'embedded' is what the flat form wrote unset; a folder is refused whatever is on disk
    # (tests/config/test_no_model_kinds.py: where an earlier version's record reads it).
    cfg = load_config(RULES, ['backends.reader.model="embedded"'])
    assert list(cfg.model_dump(mode="json")["backends"]["reader"]) == ["kind", "sampling", "schema_mode"]
    (tmp_path / "model").mkdir()
    for folder in (tmp_path / "model", tmp_path / "missing"):
        with pytest.raises(InputError, match="kind 'rules' runs no model, so model is never read"):
            load_config(RULES, [f"backends.reader.model={json.dumps(str(folder))}"])
