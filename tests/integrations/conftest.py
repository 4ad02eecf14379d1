"""Fixtures of the verl integration tests (main environment and verl lane alike): two real sessions,
a 2-chunk MemAgent task (role ``memagent``: memory updates + boxed answer trained) and a
group-B task (role ``memory``: decision memory over one BM25 search, reader on the rules backend).
Written as GRPO TOML files, the way a user hands them to ``memsearch verl config``."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MEMAGENT = """
role = "memagent"
model = "embedded"
data = "{data}"
[rollout]
group_size = 2
tasks_per_step = 2
[credit]
mode = "share"
[loss]
aggregation = "token"
[reward]
metric = "boxed_em"
invalid_call_penalty = 0.0
citation_penalty = 0.0
[episode]
tokenizer = "embedded"
[episode.agent]
evidence = "stream"
memory = "overwrite"
controller = "exhaust"
[episode.budgets]
chunk_tokens = 256
max_chunks = 2
memory_tokens = 64
policy_tokens = 48
answer_tokens = 24
"""

GROUP_B = """
role = "memory"
model = "embedded"
data = "{data}"
episode_config = "{repo}/configs/train/group_b_cpu.toml"
[rollout]
group_size = 2
tasks_per_step = 2
[credit]
mode = "share"
[loss]
aggregation = "token"
[episode.budgets]
max_searches = 2
[episode.backends.reader]
kind = "rules"
"""


@pytest.fixture(scope="session")
def verl_case(tmp_path_factory, hotpot_dev_dir):
    """``verl_case(name)``: the GRPO config ``name`` (``memagent`` | ``group_b``) over the
    40-question dev folder, written as a TOML file; returns its path."""
    tmp = tmp_path_factory.mktemp("verl-configs")
    return lambda name: _write_case(tmp, name, hotpot_dev_dir)


@pytest.fixture
def credit_case(verl_case):
    """``credit_case(mode, **credit)``: the group-B case (two searches, the memory trained, a rules
    reader) with ``credit.mode = mode`` and the other ``[credit]`` keys given; returns its path."""

    def write(mode: str, **credit) -> str:
        path = verl_case("group_b")
        keys = "".join(f"\n{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in credit.items())
        out = path.with_name(f"group_b_{mode}_{'_'.join(f'{k}{v}' for k, v in credit.items())}.toml")
        out.write_text(path.read_text().replace('mode = "share"', f'mode = "{mode}"{keys}'), encoding="utf-8")
        return str(out)

    return write


def _write_case(tmp: Path, name: str, data: Path) -> Path:
    text = {"memagent": MEMAGENT, "group_b": GROUP_B}[name].format(data=data.as_posix(), repo=REPO.as_posix())
    path = tmp / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path
