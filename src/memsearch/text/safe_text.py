"""Text from outside (model servers, model output) made safe to store as UTF-8.

A JSON body may carry a *lone surrogate* (``"\\ud800"``): Python decodes it into a ``str`` that
cannot be encoded as UTF-8, so the first write of a trajectory holding it fails, far from where
it came in. Completion text is cleaned where it enters (the backend boundary); values parsed
out of model text (memory ops) are refused as invalid actions instead of stored.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def is_surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` cannot be written as UTF-8 (it holds a surrogate code point)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def replace_lone_surrogates(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD (unchanged when there is none)."""
    if not has_lone_surrogate(text):
        return text
    return "".join(REPLACEMENT if is_surrogate(ch) else ch for ch in text)
