"""Lines of keys in a TOML file (``memsearch.config.locate``): what tomllib accepts, including
the spellings that could be taken for a key (a ``key = value`` line inside a multi-line string or
array), arrays of tables by index, inline tables and quoted keys."""

from __future__ import annotations

import tomllib

import pytest

from memsearch.config import RunConfig
from memsearch.config.locate import config_from_file, nearest_line, table_keys, toml_key_lines
from memsearch.errors import InputError

TEXT = '''\
# a comment: x = 1
top = """
not = a key
[nor.a.table]
"""
lit = \'\'\'
fake = 1\'\'\'
"quoted key".inner = 2
list = [
  1, # fake = 2
  {a = 1, b = { c = "}" }},
]

[server]  # x = 1
port = 8000
inline = { host = "h", "odd key" = 'v' }

[[run]]
name = "a"
[run.sub]
k = 1
[[run]]
name = "b"
[[run.step]]
n = 1
'''


def test_every_key_has_the_line_it_is_written_on():
    assert tomllib.loads(TEXT)  # the scan reads what tomllib accepts
    assert toml_key_lines(TEXT) == {
        "top": 2, "lit": 6, "quoted key": 8, "quoted key.inner": 8, "list": 9, "list.0": 10, "list.1": 11,
        "list.1.a": 11, "list.1.b": 11, "list.1.b.c": 11, "server": 14, "server.port": 15, "server.inline": 16,
        "server.inline.host": 16, "server.inline.odd key": 16, "run": 18, "run.0": 18, "run.0.name": 19,
        "run.0.sub": 20, "run.0.sub.k": 21, "run.1": 22, "run.1.name": 23, "run.1.step": 24, "run.1.step.0": 24,
        "run.1.step.0.n": 25,
    }


def test_a_key_the_file_does_not_write_takes_its_nearest_table():
    lines = toml_key_lines(TEXT)
    assert nearest_line(lines, "server.missing") == 14
    assert nearest_line(lines, "run.1.step.0.n.deeper") == 25
    assert nearest_line(lines, "nowhere") is None


def test_the_keys_of_a_table_follow_fields_and_stop_at_free_form_tables():
    budgets = table_keys(RunConfig, ["budgets"])
    assert budgets == sorted(budgets) and {"evidence_tokens", "max_searches", "memory_tokens"} <= set(budgets)
    assert table_keys(RunConfig, ["nosuch"]) is None
    assert "budgets" in table_keys(RunConfig, [])


def test_another_config_reports_the_same_way(tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_text('seed = 1\n\n[budgets]\nmax_searchez = 2\nmemory_tokens = "x"\n')
    with pytest.raises(InputError) as info:
        config_from_file(bad, ["budgets.evidence_tokenz=3"], RunConfig)
    lines = str(info.value).splitlines()
    assert any(line.startswith(f"{bad}:4: budgets.max_searchez: unknown field (did you mean 'max_searches'?); "
                               "valid keys of [budgets]: answer_tokens, ") for line in lines)
    assert f"{bad}:5: budgets.memory_tokens: Input should be a valid integer; got 'x'" in lines
    assert any(line.startswith("--set budgets.evidence_tokenz=3: budgets.evidence_tokenz: unknown field (did you "
                               "mean 'evidence_tokens'?)") for line in lines)
