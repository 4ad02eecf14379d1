"""studies.memory_policy.search_behaviour (module and command): searches and open items counted from
real trajectory files, against hand-counted values; the rendered memory's open items are read back
exactly."""

from __future__ import annotations

import json

import pytest
from studies.memory_policy import search_behaviour as module
from studies.memory_policy.search_behaviour import open_items, search_behaviour

from memsearch.errors import InputError
from memsearch.memory.store import MemoryItem


def _memory(*items: MemoryItem) -> dict:
    return {"type": "memory", "after": "\n".join(item.render() for item in items)}


def _search(query: str) -> dict:
    return {"type": "search", "query": query}


def test_open_items_are_read_from_the_rendering_policies_see():
    rendered = "\n".join([MemoryItem(id="m1", text="Woody Allen wrote it.", sources=("d4:0",), kind="fact").render(),
                          MemoryItem(id="m2", text="Find: Helen Hunt", sources=("d4:1",), kind="open").render(),
                          MemoryItem(id="m3", text="Find: Mad About You", sources=(), kind="open").render()])
    assert open_items(rendered) == ["Find: Helen Hunt", "Find: Mad About You"]
    assert open_items("") == []


def test_counts_match_a_hand_counted_run(tmp_path):
    helen = MemoryItem(id="m2", text="Find: Helen Hunt", sources=("d4:1",), kind="open")
    fact = MemoryItem(id="m1", text="Woody Allen wrote it.", sources=("d4:0",), kind="fact")
    tagged = MemoryItem(id="m3", text="It is a 2001 film.", sources=("d4:2",), kind="open")  # a fact tagged open
    trajectories = [
        {"task_id": "q1", "question": "Which actress starred in The Curse of the Jade Scorpion?", "events": [
            _search("the curse of the  Jade Scorpion"), _memory(fact, helen),
            _search("SEARCH helen hunt career"), _memory(fact, tagged), _search("Jade Scorpion")]},
        {"task_id": "q2", "question": "Who is older?", "events": [
            _search("who is older?"), _memory(fact), _search("who is older?")]},
        {"task_id": "q3", "question": "Where?", "events": []},
    ]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajectories))
    assert search_behaviour(tmp_path) == {
        "questions": 3, "searches": 5, "questions_with_search": 2, "questions_with_several_searches": 2,
        "questions_with_repeated_query": 1,
        "queries_in_question": 4,         # all but "SEARCH helen hunt career"
        "open_items": 2, "open_items_find": 1, "questions_with_open_item": 1,
        "searches_with_open_item_held": 2,  # the second and third searches of the first question
        # "helen hunt career" names Helen Hunt; "jade scorpion" is not in the tagged fact
        "queries_following_open_item": 1}
    with pytest.raises(InputError, match="no such file"):
        search_behaviour(tmp_path / "missing")


def test_script_prints_each_run_and_refuses_a_missing_one(tmp_path, capsys):
    script = module
    line = json.dumps({"task_id": "q1", "question": "Q?", "events": [_search("q?")]})
    (tmp_path / "trajectories.jsonl").write_text(line + "\n")
    assert script.main([str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)[str(tmp_path)]["queries_in_question"] == 1
    assert script.main([str(tmp_path / "missing")]) == 2 and script.main([]) == 2
