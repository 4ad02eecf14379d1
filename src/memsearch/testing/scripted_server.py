"""A scripted stand-in for verl's LLM server client (``server_manager``), for tests of the verl loop.

verl tests its agent loops on a CPU the same way (a fake server manager returning a
``TokenOutput``). This one answers memsearch's prompts with real token ids: it decodes the
prompt ids with a real tokenizer, picks the completion ``agent_server.answer_for`` would give
(or ``reader`` for a MemAgent final prompt, so a test controls the answer), encodes it with the
same tokenizer and appends EOS, and returns deterministic log-probs (``-0.01 * (position + 1)``),
one per id. It is not a model: it exists so the loop's plumbing is tested on real ids.

    server = ScriptedServer(tokenizer, reader="The answer is \\\\boxed{yes}")
    out = await server.generate("id", prompt_ids=[...], sampling_params={"max_tokens": 64})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memsearch.testing.agent_server import add_op, answer_for, evidence_lines

MEMORY_PROMPT = "Reply with one JSON object only"  # the decision-memory prompt (answer_for's test)


def memory_variant(prompt: str, variant: int) -> str:
    """Variant 0: ``answer_for``'s (ADD of the first evidence sentence); 1: NOOP; 2: ADD of the
    last evidence sentence (another id: gold or not, it decides differently)."""
    if variant == 1:
        return '{"ops": [{"op": "NOOP"}]}'
    lines = evidence_lines(prompt)
    return answer_for(prompt) if variant == 0 or not lines else add_op(*lines[-1])


@dataclass
class ScriptedOutput:
    """The fields of verl's ``TokenOutput`` the memsearch backend reads."""

    token_ids: list[int]
    log_probs: list[float] | None
    stop_reason: str | None = "completed"


class ScriptedServer:
    """``generate(request_id, *, prompt_ids, sampling_params)`` with scripted completions (module doc).

    ``output_cls`` builds the result (verl's ``TokenOutput`` in the verl lane); ``calls`` keeps
    ``(prompt_ids, sampling_params, completion ids)`` of every call, in order.
    """

    # Not a dataclass: hydra's instantiate (how verl builds a loop) would turn one into a config.
    def __init__(self, tokenizer: Any, reader: str | None = None, output_cls: Any = ScriptedOutput,
                 memory_variants: int = 1) -> None:
        self.tokenizer = tokenizer  # a Hugging Face tokenizer (decode / encode / eos_token_id)
        self.reader = reader
        self.output_cls = output_cls
        # > 1: the n-th decision-memory request gets variant n % memory_variants (``memory_variant``),
        # so the branches of one state (consecutive requests) decide differently
        self.memory_variants = memory_variants
        self.memory_requests = 0
        self.calls: list[tuple[list[int], dict[str, Any], list[int]]] = []

    def completion(self, prompt: str) -> str:
        if self.reader is not None and "\\boxed" in prompt:
            return self.reader
        if self.memory_variants > 1 and MEMORY_PROMPT in prompt:
            self.memory_requests += 1
            return memory_variant(prompt, (self.memory_requests - 1) % self.memory_variants)
        return answer_for(prompt)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        del request_id, kwargs
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        ids = self.tokenizer.encode(self.completion(prompt), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        cap = sampling_params.get("max_tokens")
        if cap is not None:
            ids = ids[:cap]  # as a server does: the cap wins over EOS
        self.calls.append((list(prompt_ids), dict(sampling_params), list(ids)))
        return self.output_cls(token_ids=ids, log_probs=[-0.01 * (k + 1) for k in range(len(ids))],
                               stop_reason="completed")
