"""The memory action format's constraint ids and schemas are records: pinned byte for byte.

Training rows store only a constraint id and the update replays the masks from the schema that
id names, so a schema must never change under an existing id. Each pin is the SHA-256 of the
schema's compact JSON in declared key order (the automaton walks keys in that order, so order is
part of what is pinned). A failure here means a new id is needed, not a new hash.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from memsearch.backends.base import Constraint as ProtocolConstraint
from memsearch.config import MEMORY_MAX_SOURCES
from memsearch.memory.action_format import (
    CONSTRAINTS,
    MEMORY_OPS,
    MEMORY_OPS_SCHEMA,
    MEMORY_OPS_V1,
    constraint_by_id,
    memory_ops_constraint,
    memory_ops_schema,
)
from memsearch.memory.extractive_constraint import EXTRACT_PREFIX, extractive_ops_constraint
from memsearch.text.constraint import Constraint

PINNED = {
    "memory-ops-v1": "5f9d619c8241054863e223cbb425449c3f83fa44df390299e281db42835ff42b",
    "memory-ops-v2-sources1": "cbd95fecabf5a02df1432ce37f8693004aaeb028271b3c5ef7f392eb8547f85a",
    "memory-ops-v2-sources2": "910ff326badd02335b57a583d8e9e25af42f07bc64bd99b695ebb239c890ac40",
    "memory-ops-v2-sources3": "2971b8cf45cd347e4702ce16a05ea10db164154bdd2cf7c9a6883fcc059952f7",
    "memory-ops-v2-sources5": "05849cc7f824341e920bc2ba243bcae1b00fd07ab35029c87f2efb4e85a1a8a2",
    # budget-bounded (policy_tokens 96 and 512, 3 sources): tests/memory/test_action_format_bounded.py
    "memory-ops-v3-ops1-src1x11-id4-add23-upd8": "3662cfb5cb7100129ba779ada3b98c2bf3ce23cb573ccefe362165dda3455a92",
    "memory-ops-v3-ops3-src3x11-id4-add76-upd61": "c3974659014a449c02c016f5f7fb48727f504398c99e0ad6608bbe369a644ea9",
    EXTRACT_PREFIX + '{"add":[["d1:0"],["d1:0","d2:1"]],"delete":["m1","m2"],"open":48,'
    '"update":{"m1":[["d1:0"]],"m2":[["d2:1"]]}}':
        "108db533da4e2bb5a7c0608f06c75def5cc0c04b00ee7d632cbc0d9edbee14fb",
    EXTRACT_PREFIX + '{"add":[],"delete":["m1"],"open":0,"update":{}}':
        "c08d5291ec892a9eaadd4d4fe995fe572a4c16f8fc88db2a9106d7cdc522bba2",
}


def schema_hash(constraint: Constraint) -> str:
    text = json.dumps(constraint.json_schema, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("cid", sorted(PINNED))
def test_every_pinned_id_rebuilds_its_schema_byte_for_byte(cid):
    constraint = constraint_by_id(cid)
    assert constraint.id == cid
    assert constraint.choices is None
    assert schema_hash(constraint) == PINNED[cid]


def test_the_builders_give_the_pinned_ids():
    assert sorted(CONSTRAINTS) == ["memory-ops-v1", "memory-ops-v2-sources3"]
    assert MEMORY_MAX_SOURCES == 3 and MEMORY_OPS.id == "memory-ops-v2-sources3"
    assert MEMORY_OPS_V1.json_schema == memory_ops_schema(None)
    assert MEMORY_OPS_SCHEMA is MEMORY_OPS.json_schema
    for n in (1, 2, 3, 5):
        assert memory_ops_constraint(n) is constraint_by_id(f"memory-ops-v2-sources{n}")
    # The extractive id is a function of the choices, not of the order the update items come in.
    built = extractive_ops_constraint([["d1:0"], ["d1:0", "d2:1"]], {"m2": [["d2:1"]], "m1": [["d1:0"]]},
                                      ["m1", "m2"], 48)
    assert built.id in PINNED and schema_hash(built) == PINNED[built.id]
    small = extractive_ops_constraint([], {}, ["m1"])
    assert small.id in PINNED and constraint_by_id(small.id) == small


def test_unknown_ids_are_refused_with_the_valid_ones_named():
    for bad in ("memory-op-v1", "memory-ops-v2-sources0", "memory-ops-v2-sources03", "memory-ops-v3"):
        with pytest.raises(ValueError, match="memory-ops-v1, memory-ops-v2-sources3"):
            constraint_by_id(bad)
    with pytest.raises(ValueError, match="max_sources must be at least 1"):
        memory_ops_constraint(0)


def test_the_protocol_constraint_is_the_same_class():
    # backends.base re-exports the one definition: a Constraint built in the memory layer is the
    # type a backend's request carries, and equal values stay equal across the two import paths.
    assert ProtocolConstraint is Constraint
    assert isinstance(MEMORY_OPS, ProtocolConstraint)
