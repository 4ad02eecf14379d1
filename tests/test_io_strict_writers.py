"""Every record writer writes strict JSON (issue 54): ``io.write_json``, ``io.write_jsonl``,
``io.dumps_line`` and a run folder's ``write_record`` refuse a NaN or infinity anywhere in a
record (``NonFiniteNumberError`` naming its key path), never writing a bare ``NaN``/``Infinity``,
and leave an existing file as it was. Generated records: JSON values of any nesting with one
non-finite float placed at a generated path."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsearch.eval.run_folder import write_record
from memsearch.io import NonFiniteNumberError, dumps_line, write_json, write_jsonl

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=6))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=4)),
                     max_leaves=20)
_non_finite = st.sampled_from([math.nan, math.inf, -math.inf])


@st.composite
def _with_non_finite(draw) -> tuple[dict, str, float]:
    """A record (an object) with one non-finite float at a generated path, and that path."""
    bad = draw(_non_finite)
    keys = draw(st.lists(st.one_of(st.text(alphabet="abcxyz", min_size=1, max_size=4), st.integers(0, 3)),
                         min_size=1, max_size=4))
    if isinstance(keys[0], int):
        keys[0] = f"k{keys[0]}"  # a record is an object
    value: object = bad
    for key in reversed(keys):
        value = [None] * key + [value] if isinstance(key, int) else {key: value}
    # Finite siblings before the bad number, so the path is found among other values.
    record = {**{f"_{k}": v for k, v in draw(st.dictionaries(st.text("ab", max_size=2), _json, max_size=3)).items()},
              **value}
    return record, ".".join(str(k) for k in keys), bad


def _strict(text: str):
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_with_non_finite())
def test_a_non_finite_number_anywhere_is_refused_naming_its_path_and_nothing_is_written(tmp_path, case):
    record, where, bad = case
    with pytest.raises(NonFiniteNumberError) as refused:
        dumps_line(record)
    assert refused.value.where == where and repr(bad) in str(refused.value)
    for write in (write_json, write_record):
        path = tmp_path / f"{write.__name__}.json"
        path.write_text('{"old": 1}\n')
        with pytest.raises(NonFiniteNumberError) as refused:
            write(path, record)
        assert str(refused.value).startswith(f"{path}: {where} is {bad!r}: a record file holds strict JSON only")
        assert path.read_text() == '{"old": 1}\n'
    lines = tmp_path / "lines.jsonl"
    with pytest.raises(NonFiniteNumberError) as refused:
        write_jsonl(lines, [{"ok": 1.5}, record])
    assert str(refused.value).startswith(f"{lines}: line 2: {where} is ")
    assert all(_strict(line) for line in lines.read_text().splitlines())  # what was written is strict
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.jsonl", "write_json.json", "write_record.json"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=st.dictionaries(st.text(max_size=5), _json, max_size=5))
def test_finite_records_round_trip_through_a_strict_parser(tmp_path, record):
    assert _strict(dumps_line(record)) == record
    write_json(tmp_path / "r.json", record)
    write_record(tmp_path / "s.json", record)
    assert _strict((tmp_path / "r.json").read_text()) == _strict((tmp_path / "s.json").read_text()) == record


def test_a_value_error_that_is_not_a_number_is_not_reworded():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_line(loop)
