"""The studies' tests reuse fixtures of the library's tests: the training ones (a LoRA adapter on the
tiny Llama, a prepared HotpotQA train sample; studies.memory_policy.batch_fit replays a real GRPO
run) and the tiny memory-policy pipeline config (studies.memory_policy.publish copies a real run)."""

from tests.pipelines.conftest import mp_config
from tests.train.conftest import hotpot_train_dir, tiny_adapter_dir

__all__ = ["hotpot_train_dir", "mp_config", "tiny_adapter_dir"]
