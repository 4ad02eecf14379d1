r"""Answer extraction shared by the engine (reading the reader's reply) and the metrics (scoring
it): the boxed answer of a reply and the unwrapping of LaTeX text commands.

It sits below both ``memsearch.engine`` and ``memsearch.eval`` (docs/design.md §3 and §6), so
neither imports the other for it, and it imports nothing of memsearch.

    boxed_answer(r"so \boxed{\text{Paris}}")     # r"\text{Paris}"
    boxed_prediction(r"so \boxed{\text{Paris}}") # "Paris"
    boxed_answer(r"$\boxed 42$")                 # "42"
    boxed_answer(r"\fbox{Paris}")                # "Paris"
    boxed_answer("Paris, I think")               # None: no box

Rules of ``boxed_answer`` (MemAgent's evaluator, ``taskutils/memory_eval/utils`` and verl's
``reward_score/math.py`` ``last_boxed_only_string`` / ``remove_boxed``, re-implemented; the
differences are marked *deviation*):

1. *Thinking is skipped.* When the text contains ``</think>``, only the text after the last
   ``</think>`` is searched (MemAgent's ``extract_solution``).
2. *Two forms of* ``\boxed``. A ``\boxed`` followed by optional white space and ``{`` opens a
   *brace box*; a ``\boxed`` followed by one or more spaces or tabs and then any other character
   is a *space box* (``$\boxed 42$``). Any other ``\boxed`` (``\boxedx``, or at the very end)
   opens no box.
3. *A space box wins.* When the text holds a space box anywhere, the answer is the text after
   the last space box's spaces up to the first ``$`` (or the end of the text), stripped. This is
   MemAgent's precedence: it checks for ``"\boxed "`` before looking for braces.
4. *Otherwise the last* ``\boxed`` *decides.* If it opens a brace box, the answer is the content
   up to the matching ``}``, stripped; braces nest (``\boxed{a{b}c}`` gives ``a{b}c``). If the
   last ``\boxed`` opens no box, or its box never closes (a truncated reply), there is no answer:
   an earlier, complete box is not taken as the final answer.
5. ``\fbox{...}`` *counts only without* ``\boxed``: when the text has no ``\boxed`` at all, the
   last ``\fbox`` is read as a brace box by rule 4. (*Deviation*: MemAgent finds the ``\fbox``
   but its ``remove_boxed`` then fails on it, so its evaluator scores such a reply 0.)
6. *Escaped braces* ``\{`` ``\}`` *do not count* when matching braces (*deviation*: MemAgent
   counts them, so ``\boxed{\{1\}}`` ends early there).
7. An empty box gives ``""``: a box, but an answer that scores 0 under every answer metric.

``boxed_prediction`` is ``boxed_answer`` with LaTeX text commands unwrapped (``unwrap_latex_text``)
and the result stripped: the answer a metric compares with the gold answers.

``unwrap_latex_text`` replaces ``\text{X}`` (and ``\textbf``, ``\textit``, ``\textrm``,
``\texttt``, ``\mathrm``, ``\mathbf``, ``\mbox``, ``\emph``; white space allowed before the
brace) by ``X`` at every nesting depth, when the brace closes; an unclosed wrapper is kept as
written.

Every function here runs in time linear in the length of its input: scans move forward only and
no regular expression can backtrack (a 100 000-character reply costs milliseconds, tested).
"""

from __future__ import annotations

_BOXED = "\\boxed"
_FBOX = "\\fbox"
_THINK_END = "</think>"
# LaTeX text wrappers a model puts inside a box; unwrapped before an answer is compared.
_TEXT_WRAPPERS = frozenset({"text", "textbf", "textit", "textrm", "texttt", "mathrm", "mathbf", "mbox", "emph"})
_SPACE = " \t"


def _skip_white(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _matching_brace(text: str, open_at: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_at`` (escaped braces skipped), or None."""
    depth = 0
    i = open_at
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character, \{ and \} included, never counts
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _scan_boxes(text: str) -> tuple[int | None, int | None, bool]:
    """One forward pass over the ``\\boxed`` commands of ``text``.

    Returns (start of the answer of the last space box, position of the ``{`` of the last
    ``\\boxed`` when it opens a brace box, whether any ``\\boxed`` occurs). Each command's white
    space is scanned once, and the white space after one command ends before the next ``\\``,
    so the pass is linear.
    """
    last_space: int | None = None
    last_brace: int | None = None
    seen = False
    i = text.find(_BOXED)
    while i >= 0:
        seen = True
        after = i + len(_BOXED)
        j = _skip_white(text, after)
        last_brace = None
        if j < len(text) and text[j] == "{":
            last_brace = j
        elif j > after and j < len(text) and text[after] in _SPACE:
            last_space = j
        i = text.find(_BOXED, max(j, after))
    return last_space, last_brace, seen


def boxed_answer(text: str | None) -> str | None:
    r"""The final boxed answer of ``text``, stripped, as written (LaTeX kept); ``None`` when the
    reply has no complete final box. The rules are listed in the module docstring."""
    if text is None:
        return None
    think = text.rfind(_THINK_END)
    if think >= 0:
        text = text[think + len(_THINK_END):]
    last_space, last_brace, seen_boxed = _scan_boxes(text)
    if last_space is not None:
        end = text.find("$", last_space)
        return text[last_space: end if end >= 0 else len(text)].strip()
    if not seen_boxed:
        fbox = text.rfind(_FBOX)
        if fbox < 0:
            return None
        j = _skip_white(text, fbox + len(_FBOX))
        last_brace = j if j < len(text) and text[j] == "{" else None
    if last_brace is None:
        return None
    close = _matching_brace(text, last_brace)
    if close is None:
        return None
    return text[last_brace + 1: close].strip()


def _brace_pairs(s: str) -> dict[int, int]:
    """Each ``{`` that closes, mapped to its ``}`` (escaped braces skipped); one pass, a stack."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def unwrap_latex_text(s: str) -> str:
    r"""``s`` with every closed ``\text{...}``-like wrapper replaced by its content, at any depth
    (``\textbf{\text{Paris}}`` gives ``Paris``); unclosed wrappers and other commands are kept."""
    pairs = _brace_pairs(s)
    drop: set[int] = set()  # character positions of wrappers' commands and braces
    i = 0
    n = len(s)
    while i < n:
        if s[i] != "\\":
            i += 1
            continue
        j = i + 1
        while j < n and s[j].isalpha():
            j += 1
        name_end = j
        k = _skip_white(s, j)
        if s[i + 1: name_end] in _TEXT_WRAPPERS and k < n and s[k] == "{" and k in pairs:
            drop.update(range(i, k + 1))
            drop.add(pairs[k])
            i = k + 1
        else:
            i = max(name_end, i + 2)  # a command, or an escaped character
    if not drop:
        return s
    return "".join(ch for pos, ch in enumerate(s) if pos not in drop)


def boxed_prediction(text: str | None) -> str | None:
    r"""The boxed answer of ``text`` as a metric compares it: ``boxed_answer`` with text
    wrappers unwrapped, stripped; ``None`` when there is no box (a miss, scored 0)."""
    answer = boxed_answer(text)
    if answer is None:
        return None
    return unwrap_latex_text(answer).strip()
