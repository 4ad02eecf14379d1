"""Write tests/integrations/fixtures/verl_advantage_parity.json with verl's own GRPO advantages.

Run once, in the verl environment (the fixture is committed; the main test suite reads it
without verl):

    UV_PROJECT_ENVIRONMENT=.venv-verl uv sync --frozen --extra verl --no-dev
    .venv-verl/bin/python scripts/verl/make_parity_fixture.py

Sessions (keys ``{uid}_{session}_{index}``, as verl's v1 trainer names rows) in three groups:
``a`` (3 sessions of 2, 3 and 1 rows), ``b`` (2 sessions, equal rewards: zero variance) and
``c`` (one session: verl's singleton rule). Each row has its own response length; the reward
sits on the last response token of the session's final row (verl's reward placement). verl's
``compute_advantage_for_multi_trajectories`` runs with std-scaling on and off; the fixture
records, per row, the advantage scalar and whether every unmasked token carries it (and every
masked one 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

OUT = Path(__file__).resolve().parents[2] / "tests/integrations/fixtures/verl_advantage_parity.json"
MAX_LEN = 8
# (uid, session, reward, response lengths of the session's rows in order)
SESSIONS = [("a", 0, 1.0, [3, 5]), ("a", 1, 0.2, [2, 4, 6]), ("a", 2, -0.5, [7]),
            ("b", 0, 0.5, [4, 2]), ("b", 1, 0.5, [3]),
            ("c", 0, 0.75, [5, 1])]


def build() -> tuple[list[str], DataProto, list[int]]:
    keys, masks, rewards, uids, lengths = [], [], [], [], []
    for uid, session, reward, lens in SESSIONS:
        for index, n in enumerate(lens):
            keys.append(f"{uid}_{session}_{index}")
            mask = [1] * n + [0] * (MAX_LEN - n)
            row_reward = [0.0] * MAX_LEN
            if index == len(lens) - 1:
                row_reward[n - 1] = reward  # the reward manager puts the score on the last valid token
            masks.append(mask)
            rewards.append(row_reward)
            uids.append(uid)
            lengths.append(n)
    data = DataProto.from_dict(tensors={"response_mask": torch.tensor(masks, dtype=torch.float32),
                                        "token_level_rewards": torch.tensor(rewards, dtype=torch.float32)},
                               non_tensors={"uid": np.array(uids, dtype=object)})
    return keys, data, lengths


def main() -> None:
    out = {
        "verl_version": verl.__version__,
        "function": "verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories",
        "max_len": MAX_LEN,
        "sessions": [{"uid": u, "session": s, "reward": r, "lengths": lens} for u, s, r, lens in SESSIONS],
        "advantages": {},
    }
    for norm in (True, False):
        keys, data, lengths = build()
        result = compute_advantage_for_multi_trajectories(
            data, keys, core_algos.AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=norm
        )
        adv = result.batch["advantages"]
        rows = []
        for i, key in enumerate(keys):
            scalar = float(adv[i, 0])
            n = lengths[i]
            broadcast = bool(torch.allclose(adv[i, :n], torch.full((n,), scalar)) and not adv[i, n:].any())
            rows.append({"key": key, "advantage": scalar, "broadcast": broadcast})
        out["advantages"]["std" if norm else "no_std"] = rows
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
