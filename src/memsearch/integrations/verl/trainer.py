"""``MemsearchTrainer``: verl 0.9.1's synchronous v1 trainer with memsearch's split and state credit
(imports verl; no fork of it).

Registered with ``@register_trainer("memsearch")`` when this module is imported. ``memsearch verl
config`` (``credit.mode = "split"`` or ``"state"``) chooses it with ``trainer.v1.trainer_mode=memsearch``
and imports this module into every Ray process verl starts through the runtime environment's
``VERL_USE_EXTERNAL_MODULES`` (verl's ``__init__`` imports the modules it names), so the task
runner's ``get_trainer_cls("memsearch")`` finds it.

It changes one step of verl's: ``_compute_advantage`` runs verl's own (the KL-in-reward and
rollout-correction steps, then GRPO over each session's last row), reads back every row's credit
record (``extra_fields["memsearch_credit"]``, written by the agent loop), its score and its response
mask from the TransferQueue, and writes ``credit.row_advantages`` in place of verl's advantages
(and returns: GRPO's returns are its advantages). A batch whose records say ``share`` keeps verl's.

verl's base trainer branches on ``trainer_mode == "sync"`` (its replay buffer, data loader refill,
checkpoint and rollout submission; ``verl/trainer/ppo/v1/trainer_base.py``) and refuses to register
a second class under ``sync``: registered under its own name, this class would run the async
replay buffer. So it reports ``trainer_mode`` as ``"sync"``, and reads ``trainer.v1.sync``.
"""

from __future__ import annotations

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from memsearch.integrations.verl import TRAINER_NAME
from memsearch.integrations.verl.credit import (
    CREDIT_FIELD,
    CreditRecord,
    CreditRecordError,
    batch_mode,
    row_advantages,
)


@register_trainer(TRAINER_NAME)
class MemsearchTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer whose advantages are memsearch's credit (module doc)."""

    @property
    def trainer_mode(self) -> str:
        return "sync"  # verl's base compares with the literal "sync" (module doc)

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        del value  # the base assigns trainer.v1.trainer_mode ("memsearch"); the behaviour is sync's

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        return self._memsearch_credit(batch, metrics)

    def _memsearch_credit(self, batch, metrics: dict):
        """Replace the advantages of ``batch`` (a ``KVBatchMeta``) by memsearch's credit (module doc)."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["extra_fields", "rm_scores", "response_mask"])
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        records = [None if pad else CreditRecord.from_row(key, (extra or {}).get(CREDIT_FIELD))  # read once
                   for key, extra, pad in zip(batch.keys, list(data["extra_fields"]), padding, strict=True)]
        mode = batch_mode(batch.keys, records, padding)
        if mode == "share":
            return batch
        algorithm = self.config.algorithm
        if algorithm.adv_estimator != core_algos.AdvantageEstimator.GRPO or algorithm.use_kl_in_reward:
            raise CreditRecordError(f"credit.mode = {mode!r} needs algorithm.adv_estimator=grpo and no "
                                    "use_kl_in_reward (the session score is the reward); write the overrides with "
                                    "memsearch verl config")
        scores = [float(row.sum()) for row in data["rm_scores"].unbind()]
        result = row_advantages(batch.keys, records, scores, padding,
                                group_size=self.config.actor_rollout_ref.rollout.n,
                                std_scale=bool(algorithm.get("norm_adv_by_std_in_grpo", True)))
        masks = data["response_mask"].unbind()
        advantages = torch.nested.as_nested_tensor(
            [adv * mask.to(torch.float32) for adv, mask in zip(result.advantages, masks, strict=True)],
            layout=torch.jagged)
        fields = TensorDict({"advantages": advantages, "returns": advantages.clone()}, batch_size=len(batch))
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        metrics.update(result.metrics())
        return batch

