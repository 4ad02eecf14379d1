"""Schema mode: a JSON automaton and the token masks it compiles to, replayable from an id.

docs/design.md §7: schema mode samples each token from the model's distribution renormalized on the
tokens the constraint allows, and training recomputes new and old log-probs under the *same*
masks. So the mask in force before every completion token must be a pure function of
``(constraint id, tokenizer, the completion ids before it)``: ``TokenConstraint.masks_for``
replays it from the ids a rollout recorded, and the ``hf`` decoder uses the very same object.

How it works
    1. ``Automaton(constraint)``: a character-level automaton over the output text. A
       state is a frozenset of *threads* (several only while ``anyOf`` variants or enum options
       are ambiguous); a thread is a tuple stack of frames (value, object, array, string,
       literal). Supported: ``type`` object (``properties``, ``required``; keys in declared
       order, optional ones may be skipped, no other keys), array (``items``, ``minItems``,
       ``maxItems``), string (``minLength``, ``maxLength``; any JSON string character and
       escape, no raw control character), boolean, null; ``enum`` / ``const`` (matched as
       compact JSON text); ``anyOf`` / ``oneOf`` (alike). Anything else raises ``ValueError``
       naming the keyword. ``choices``: exactly one of the strings (raw text). White space
       goes where JSON allows it, at most ``MAX_WHITESPACE`` characters per gap (sampling
       cannot loop on it), none after the value. Counters saturate, so there are few states
       unless ``maxLength`` / ``maxItems`` are used (then one per count).
    2. ``compile_constraint(constraint, hf_tokenizer)`` lifts it to token ids. Byte-level BPE
       tokens (GPT-2 style, like the embedded SmolLM2) are decoded through the byte decoder,
       other tokenizers through ``decode([id])``. A token that is not valid UTF-8 on its own
       (part of a multi-byte character) is never allowed, nor are special or empty tokens:
       simple and correct (a token's text never depends on its neighbours), at the price that
       characters only such tokens spell cannot be generated. ``allowed(state)`` walks a prefix
       trie of all token texts through the automaton, pruning at the first dead character,
       memoized per state; outside strings only the automaton's alphabet is tried; inside a
       string all tokens of plain string characters are allowed at once and only the tokens
       holding ``"``, ``\\`` or a control character are walked.
    3. EOS (the tokenizer's ``eos_token_id``) is allowed exactly when the text is a complete
       value; then it is the only token allowed.

Cost (embedded tokenizer, 49152 ids, 2-core CPU): ~1.1 s once per tokenizer (decode the
vocabulary, build the tries); ~0.6 ms per new state (at most ~2 ms); a 124-token memory-ops
output with all four op kinds visits 60 distinct states, and ``MEMORY_OPS`` (at most 3 sources
per item) has 330 reachable states in all (270 for the uncapped v1; so at most ~16 MB of
memoized masks); ``masks_for`` on memoized states ~2 ms for 124 tokens.

This module knows no particular constraint: it compiles any ``Constraint`` it is given. The
memory action format's constraints and their ids (``memory-ops-v1``, ``memory-ops-v2-sources<n>``,
the budget-bounded ``memory-ops-v3-...``, the per-call ``memory-extract-v1:<json>``) live in
``memsearch.memory.action_format``, whose ``constraint_by_id`` rebuilds one from a row's id;
``compile_constraint`` keeps per-call ones in a bounded LRU (``PER_CALL_CACHE_SIZE``).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from memsearch.backends.base import Constraint
from memsearch.memory.extractive_constraint import EXTRACT_PREFIX

if TYPE_CHECKING:
    import torch

# White-space characters allowed in one gap between JSON tokens. Part of what a constraint id
# means (it changes the masks): change it only together with the ids.
MAX_WHITESPACE = 1
_WS = frozenset(" \t\n\r")
_HEX, _ESCAPES = frozenset("0123456789abcdefABCDEF"), frozenset('"\\/bfnrt')


# ---------------------------------------------------------------------------------- automaton
# Frame kinds (first field of a frame tuple) and object / array phases.
_V, _O, _A, _S, _L = "V", "O", "A", "S", "L"
_OPEN, _KEY, _COLON, _AFTER, _COMMA = range(5)
State = frozenset  # of threads; a thread is a tuple of frames (the empty tuple: value complete)
DONE: State = frozenset({("<eos>",)})  # after EOS: nothing more

_KNOWN = set(
    "type properties required additionalProperties items minItems maxItems minLength maxLength enum "
    "const anyOf oneOf title description $schema default examples".split()
)


class Automaton:
    """Character-level automaton of one constraint (no tokenizer needed): ``start``,
    ``step(state, ch)`` (the empty set when not allowed), ``complete``, ``walk``."""

    def __init__(self, constraint: Constraint) -> None:
        self.nodes: list[tuple] = []
        if (constraint.json_schema is None) == (constraint.choices is None):
            raise ValueError(f"constraint {constraint.id!r}: give exactly one of json_schema and choices")
        if constraint.choices is not None:
            root = self._node(("lit", tuple(constraint.choices)))
            threads = {((_L, root, ""),)} | ({()} if "" in constraint.choices else set())
        else:
            root = self._compile(constraint.json_schema, "$")
            threads = {((_V, root, 0),)}
        self._start: State = frozenset(threads)
        self._trans: dict[State, dict[str, State]] = {}
        # Outside strings only these characters can ever be allowed (see ``in_text``).
        words = [w for node in self.nodes if node[0] in ("lit", "obj") for w in node[1]]
        self.alphabet = frozenset('{}[],:"').union(_WS, *(w if isinstance(w, str) else w[0] for w in words))
        self._in_text: dict[State, bool] = {}

    def _node(self, node: tuple) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _compile(self, s: Any, where: str) -> int:
        if not isinstance(s, dict):
            raise ValueError(f"{where}: a schema must be an object, got {s!r}")
        unknown = sorted(set(s) - _KNOWN)
        if unknown:
            raise ValueError(
                f"{where}: unsupported JSON-schema keyword {unknown[0]!r} (supported: {', '.join(sorted(_KNOWN))})"
            )
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else s["enum"]
            # compact (no space after "," or ":"): a list or object value is one exact text
            compact = tuple(json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values)
            return self._node(("lit", compact))
        for key in ("anyOf", "oneOf"):
            if key in s:
                return self._node(("alt", tuple(self._compile(v, f"{where}.{key}[{i}]") for i, v in enumerate(s[key]))))
        kind = s.get("type")
        if kind == "object":  # undeclared keys are never generated, whatever additionalProperties says
            props = s.get("properties", {})
            missing = [r for r in s.get("required", []) if r not in props]
            if missing:
                raise ValueError(f"{where}: required key {missing[0]!r} is not in properties")
            if any(c in '"\\' or ord(c) < 0x20 for name in props for c in name):
                raise ValueError(f"{where}: keys that need escaping are not supported")
            children = tuple((name, self._compile(p, f"{where}.{name}")) for name, p in props.items())
            return self._node(("obj", children, tuple(name in s.get("required", []) for name in props)))
        if kind == "array":
            if "items" not in s:
                raise ValueError(f"{where}: an array needs 'items'")
            return self._node(
                ("arr", self._compile(s["items"], f"{where}[]"), int(s.get("minItems", 0)), s.get("maxItems"))
            )
        if kind == "string":
            return self._node(("str", int(s.get("minLength", 0)), s.get("maxLength")))
        if kind in ("boolean", "null"):
            return self._node(("lit", ("true", "false") if kind == "boolean" else ("null",)))
        raise ValueError(
            f"{where}: unsupported schema type {kind!r} (object, array, string, boolean, null, enum, const, anyOf)"
        )

    def start(self) -> State:
        return self._start

    @staticmethod
    def complete(state: State) -> bool:
        return () in state  # some thread has finished the whole value

    def step(self, state: State, ch: str) -> State:
        trans = self._trans.get(state) or self._trans.setdefault(state, {})
        nxt = trans.get(ch)
        if nxt is None:
            nxt = trans[ch] = frozenset(t for thread in state for t in self._step(thread, ch))
        return nxt

    def in_text(self, state: State) -> bool:
        """Some thread is inside a string: characters outside ``alphabet`` may be allowed."""
        if state not in self._in_text:
            self._in_text[state] = any(thread and thread[-1][0] == _S for thread in state)
        return self._in_text[state]

    def walk(self, text: str, state: State | None = None) -> State:
        state = self._start if state is None else state
        for ch in text:
            if not (state := self.step(state, ch)):
                break
        return state

    def accepts(self, text: str) -> bool:
        """``text`` is a complete value; ``prefix_ok``: it is one or can still become one."""
        return self.complete(self.walk(text))

    def prefix_ok(self, text: str) -> bool:
        return bool(self.walk(text))

    def _begin(self, stack: tuple, nid: int, ch: str) -> list[tuple]:
        """Threads after ``ch`` (not white space) starts a value of node ``nid`` on ``stack``."""
        node = self.nodes[nid]
        kind = node[0]
        if kind == "obj":
            return [stack + ((_O, nid, 0, _OPEN, 0, ""),)] if ch == "{" else []
        if kind == "arr":
            return [stack + ((_A, nid, 0, _OPEN, 0),)] if ch == "[" else []
        if kind == "str":
            return [stack + ((_S, nid, 0, 0),)] if ch == '"' else []
        if kind == "lit":
            return self._lit(stack, nid, "", ch)
        return [t for v in node[1] for t in self._begin(stack, v, ch)]  # alt

    def _lit(self, stack: tuple, nid: int, prefix: str, ch: str) -> list[tuple]:
        text, options = prefix + ch, self.nodes[nid][1]
        out = [stack] if text in options else []  # finished: pop at once (eager)
        if any(len(o) > len(text) and o.startswith(text) for o in options):
            out.append(stack + ((_L, nid, text),))  # an option goes on (ambiguity keeps both)
        return out

    def _str_char(self, stack: tuple, nid: int, n: int) -> list[tuple]:
        _, min_len, max_len = self.nodes[nid]  # the count saturates at the bound that matters
        if max_len is not None and n + 1 > max_len:
            return []
        return [stack + ((_S, nid, min(n + 1, max_len if max_len is not None else min_len), 0),)]

    def _step(self, thread: tuple, ch: str) -> list[tuple]:
        if not thread or thread[0] == "<eos>":
            return []  # a complete value: nothing may follow
        top, rest = thread[-1], thread[:-1]
        kind = top[0]
        if kind == _S:
            _, nid, n, esc = top
            if esc == 0:
                if ch == '"':
                    return [rest] if n >= self.nodes[nid][1] else []
                if ch == "\\":  # an escape is one more character: only where one fits
                    max_len = self.nodes[nid][2]
                    return [rest + ((_S, nid, n, 1),)] if max_len is None or n < max_len else []
                return [] if ord(ch) < 0x20 else self._str_char(rest, nid, n)
            if esc == 1 and ch == "u":  # \\uXXXX: esc counts 2..5 through the hex digits
                return [rest + ((_S, nid, n, 2),)]
            if esc == 2 and ch in "dD" and self.nodes[nid][2] is not None:
                # A bounded string (only the extractive open text has one) admits no surrogate
                # escape (\\ud800-\\udfff): the parser refuses one. Unbounded strings keep their
                # masks unchanged, so rows sampled under older ids replay as they were sampled.
                return [rest + ((_S, nid, n, 6),)]
            if esc == 6:
                return [rest + ((_S, nid, n, 4),)] if ch in "01234567" else []
            if ch not in (_ESCAPES if esc == 1 else _HEX):
                return []
            return self._str_char(rest, nid, n) if esc in (1, 5) else [rest + ((_S, nid, n, esc + 1),)]
        if kind == _L:
            return self._lit(rest, top[1], top[2], ch)
        if kind == _V:
            _, nid, ws = top
            if ch in _WS:
                return [rest + ((_V, nid, ws + 1),)] if ws < MAX_WHITESPACE else []
            return self._begin(rest, nid, ch)
        if kind == _O:
            return self._step_object(rest, top, ch)
        return self._step_array(rest, top, ch)

    def _step_object(self, rest: tuple, top: tuple, ch: str) -> list[tuple]:
        _, nid, i, phase, ws, prefix = top
        _, props, required = self.nodes[nid]
        if phase != _KEY and ch in _WS:
            return [rest + ((_O, nid, i, phase, ws + 1, prefix),)] if ws < MAX_WHITESPACE else []
        may_close = not any(required[i:])
        if phase in (_OPEN, _AFTER) and ch == "}":
            return [rest] if may_close else []
        if phase in (_OPEN, _COMMA) and ch == '"':
            return [rest + ((_O, nid, i, _KEY, 0, ""),)] if i < len(props) else []
        if phase == _AFTER:
            return [rest + ((_O, nid, i, _COMMA, 0, ""),)] if ch == "," and i < len(props) else []
        if phase == _COLON:
            return [rest + ((_O, nid, i + 1, _AFTER, 0, ""), (_V, props[i][1], 0))] if ch == ":" else []
        if phase != _KEY:
            return []
        # Keys come in declared order; optional ones may be skipped, required ones not.
        last = next((j for j in range(i, len(props)) if required[j]), len(props) - 1)
        names = [(j, props[j][0]) for j in range(i, last + 1)]
        if ch == '"':
            return [rest + ((_O, nid, j, _COLON, 0, ""),) for j, name in names if name == prefix]
        text = prefix + ch
        return [rest + ((_O, nid, i, _KEY, 0, text),)] if any(n.startswith(text) for _, n in names) else []

    def _step_array(self, rest: tuple, top: tuple, ch: str) -> list[tuple]:
        _, nid, count, phase, ws = top
        _, item, min_items, max_items = self.nodes[nid]
        if ch in _WS:
            return [rest + ((_A, nid, count, phase, ws + 1),)] if ws < MAX_WHITESPACE else []
        if ch == "]":
            return [rest] if count >= min_items else []
        more = max_items is None or count < max_items
        cap = max_items if max_items is not None else min_items
        after = rest + ((_A, nid, min(count + 1, cap), _AFTER, 0),)
        if phase == _AFTER:
            return [after + ((_V, item, 0),)] if ch == "," and more else []
        return self._begin(after, item, ch) if more else []


# ----------------------------------------------------------------------------------- tokens
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable stand-in character -> byte."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]  # bytes that stand for themselves
    moved = [b for b in range(256) if b not in keep]  # the others are shifted past 255
    return {chr(b): b for b in keep} | {chr(256 + k): b for k, b in enumerate(moved)}


def token_texts(tokenizer: Any) -> list[str | None]:
    """The text of every vocabulary id, or ``None`` for ids that can never be allowed: special
    tokens, empty tokens and tokens that are not valid UTF-8 on their own."""
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    byte_level = backend is not None and type(backend.decoder).__name__ == "ByteLevel"
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    bytemap, out = _byte_decoder(), []
    for i, piece in enumerate(pieces):
        text = None
        try:
            if i in special or not piece:
                pass
            elif byte_level and all(c in bytemap for c in piece):
                text = bytes(bytemap[c] for c in piece).decode("utf-8")
            else:  # other tokenizers (and non-special added tokens): their own decoder
                text = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                text = None if "\ufffd" in text else text
        except UnicodeDecodeError:
            pass  # part of a multi-byte character
        out.append(text or None)
    return out


def _trie(items: list[tuple[int, str]]) -> tuple[dict, list[int]]:
    """Prefix trie: a node is ``(children by character, ids whose text ends here)``."""
    root: tuple[dict, list[int]] = ({}, [])
    for tid, text in items:
        node = root
        for ch in text:
            node = node[0].setdefault(ch, ({}, []))
        node[1].append(tid)
    return root


class _Vocab:
    """What a tokenizer's vocabulary looks like to the automaton (shared by its constraints)."""

    def __init__(self, tokenizer: Any) -> None:
        self.texts = token_texts(tokenizer)
        self.size = len(self.texts)
        eos = tokenizer.eos_token_id
        self.eos_ids = tuple(sorted({eos} if isinstance(eos, int) else set(eos or ())))
        if not self.eos_ids:
            raise ValueError("the tokenizer has no eos_token_id; a constraint needs one to end the output")
        valid = [(i, t) for i, t in enumerate(self.texts) if t]
        self.trie = _trie(valid)
        # Plain string characters loop inside a JSON string: those tokens are handled at once,
        # through one byte per id (its length, 0 = not plain; longer than 255: walked) and translate.
        plain = [len(t) < 256 and not any(c in '"\\' or ord(c) < 0x20 for c in t) for _, t in valid]
        lens = bytearray(self.size)
        for (i, t), p in zip(valid, plain, strict=True):
            lens[i] = len(t) if p else 0
        self.plain_lens = bytes(lens)
        self.special_trie = _trie([it for it, p in zip(valid, plain, strict=True) if not p])

    def plain_fitting(self, room: int) -> bytearray:
        """One byte per id: 1 for plain tokens of at most ``room`` characters."""
        return bytearray(self.plain_lens.translate(bytes(int(0 < k <= room) for k in range(256))))


class TokenConstraint:
    """A constraint over one tokenizer's ids: what may come next, and the replay of masks.
    ``State`` values are hashable and belong to this object; ``allowed`` is memoized per state
    (the tensor is shared: do not modify it), ``advance`` per (state, token)."""

    def __init__(self, constraint: Constraint, vocab: _Vocab) -> None:
        self.id = constraint.id
        self.vocab_size = vocab.size
        self.eos_ids = vocab.eos_ids
        self.automaton = Automaton(constraint)
        self._vocab = vocab
        self._masks: dict[State, tuple[bytearray, torch.Tensor]] = {}  # one byte per id, and a view
        self._next: dict[tuple[State, int], State] = {}
        self._forbid: dict[tuple[State, Any, int], torch.Tensor | None] = {}

    def start(self) -> State:
        return self.automaton.start()  # before the first completion token

    def allowed(self, state: State) -> torch.Tensor:
        """Bool (vocab_size,): the tokens that may come in ``state`` (computed once per state)."""
        if state not in self._masks:
            import torch

            buf = self._compute(state)
            self._masks[state] = (buf, torch.frombuffer(buf, dtype=torch.bool))
        return self._masks[state][1]

    def advance(self, state: State, token_id: int) -> State:
        """The state after ``token_id``; ``ValueError`` if ``state`` does not allow it."""
        key = (state, int(token_id))
        if key in self._next:
            return self._next[key]
        if not 0 <= key[1] < self.vocab_size or not bool(self.allowed(state)[key[1]]):
            raise ValueError(f"constraint {self.id!r}: token {token_id} is not allowed here")
        self._next[key] = DONE if key[1] in self.eos_ids else self.automaton.walk(self._vocab.texts[key[1]], state)
        return self._next[key]

    def mask_logits(self, logits: torch.Tensor, state: State) -> bool:
        """-inf, in place, on what ``state`` forbids in one row of ``logits`` (ids past
        ``vocab_size`` too); ``False`` (row untouched) when nothing is allowed. Kept per device."""
        import torch

        key = (state, logits.device, logits.shape[-1])
        if key not in self._forbid:
            allowed = self.allowed(state)[: logits.shape[-1]]
            forbid = torch.ones(logits.shape[-1], dtype=torch.bool)
            forbid[: allowed.shape[0]] = ~allowed
            self._forbid[key] = forbid.to(logits.device) if bool(allowed.any()) else None
        forbid = self._forbid[key]
        if forbid is not None:
            logits.masked_fill_(forbid, float("-inf"))
        return forbid is not None

    def masks_for(self, completion_ids: Any) -> torch.Tensor:
        """Bool (len(completion_ids), vocab_size): the mask in force before each completion token
        (the replay of what the decoder applied). ``ValueError`` names the first token the
        constraint does not allow."""
        import torch

        state, rows = self.start(), []
        for pos, tid in enumerate(completion_ids):
            self.allowed(state)
            rows.append(self._masks[state][0])
            try:
                state = self.advance(state, int(tid))
            except ValueError as exc:
                raise ValueError(f"{exc} (completion position {pos})") from None
        if not rows:
            return torch.zeros((0, self.vocab_size), dtype=torch.bool)
        # joined as bytes: one memcpy per row (torch.stack is multi-threaded, slow on a busy CPU)
        return torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.bool).view(len(rows), self.vocab_size)

    @property
    def states_seen(self) -> int:
        return len(self._masks)  # distinct states whose mask has been computed so far

    def _compute(self, state: State) -> bytearray:
        # Built in a bytearray and wrapped without a copy: elementwise torch ops on a vocabulary
        # -sized tensor run multi-threaded and were 10-50x slower on a busy 2-core CPU.
        vocab, auto = self._vocab, self.automaton
        loop = self._string_loop(state)
        mask = vocab.plain_fitting(loop) if loop is not None else bytearray(vocab.size)
        for eos in self.eos_ids:
            mask[eos] = auto.complete(state)
        if state == DONE or not state or state == frozenset({()}):
            return mask  # nothing, or EOS alone once complete
        trie = vocab.special_trie if loop is not None else vocab.trie  # in a string: the rest
        ids: list[int] = []
        step, alpha, stack = auto.step, auto.alphabet, [(trie, state)]
        while stack:
            (children, _), st = stack.pop()
            items = children.items()
            if len(children) > len(alpha) and not auto.in_text(st):  # skip characters that cannot fit
                items = [(c, children[c]) for c in alpha if c in children]
            for ch, child in items:
                nst = step(st, ch)
                if nst:
                    ids.extend(child[1])
                    if child[0]:
                        stack.append((child, nst))
        for i in ids:
            mask[i] = 1
        return mask

    def _string_loop(self, state: State) -> int | None:
        """Characters a plain run may still add, when ``state`` is one thread inside a string
        (not in an escape); ``None`` otherwise."""
        thread = next(iter(state)) if len(state) == 1 else None
        if not thread or thread[-1][0] != _S or thread[-1][3] != 0:
            return None
        max_len = self.automaton.nodes[thread[-1][1]][2]
        return 255 if max_len is None else max_len - thread[-1][2]


# Constraints built per call (their ids start with one of these) are many and each is used for a
# while only: they are kept in a least-recently-used cache of PER_CALL_CACHE_SIZE per tokenizer.
# Each holds the masks of the states it visited, one byte per vocabulary id (49 KB a state with the
# embedded tokenizer; a 26-token extractive op visits 27 states, ~1.3 MB, so ~340 MB when full,
# and as much again on the decoding device for ``mask_logits``). A miss costs a recompute (~15 ms
# for such an op on a 2-core CPU), never a different mask. Other ids (a few fixed ones) stay.
PER_CALL_PREFIXES = (EXTRACT_PREFIX,)
PER_CALL_CACHE_SIZE = 256

_LOCK = threading.Lock()
# tokenizer -> (vocab, {id: (schema, compiled)} for fixed ids, the same in LRU order for per-call ids)
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile_constraint(constraint: Constraint, hf_tokenizer: Any) -> TokenConstraint:
    """``constraint`` over ``hf_tokenizer``'s ids, cached per (constraint id, tokenizer object);
    per-call ids (``PER_CALL_PREFIXES``) in an LRU of ``PER_CALL_CACHE_SIZE``: an evicted one is
    compiled again (same masks, computed again). Two different constraints under one id raise
    ``ValueError``: rows store only the id."""
    with _LOCK:
        if hf_tokenizer not in _CACHE:
            _CACHE[hf_tokenizer] = (_Vocab(hf_tokenizer), {}, OrderedDict())
        vocab, fixed, per_call = _CACHE[hf_tokenizer]
        fingerprint = json.dumps([constraint.json_schema, constraint.choices])
        compiled = per_call if constraint.id.startswith(PER_CALL_PREFIXES) else fixed
        if constraint.id not in compiled:
            compiled[constraint.id] = (fingerprint, TokenConstraint(constraint, vocab))
            while compiled is per_call and len(per_call) > PER_CALL_CACHE_SIZE:
                per_call.popitem(last=False)
        elif compiled[constraint.id][0] != fingerprint:
            raise ValueError(f"constraint id {constraint.id!r} already names a different constraint")
        elif compiled is per_call:
            per_call.move_to_end(constraint.id)
        return compiled[constraint.id][1]


__all__ = [
    "MAX_WHITESPACE",
    "PER_CALL_CACHE_SIZE",
    "PER_CALL_PREFIXES",
    "Automaton",
    "TokenConstraint",
    "compile_constraint",
    "token_texts",
]
