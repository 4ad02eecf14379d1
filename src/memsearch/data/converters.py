"""Dataset converters by name: a source file of some benchmark -> a memsearch data folder.

Each converter is one ``convert.SourceConverter`` (its record converter, its manifest format and
what it reads) registered here under the name commands use (``memsearch data prepare-hotpot``
converts with ``source_converter("hotpot")``). A new one is a module defining its converter and
one ``register_converter`` call (tests/extension/test_add_dataset.py):

    register_converter(SourceConverter("tinyqa", SourceFormat("tinyqa", "sentence", "tinyqa-1"),
                                       "TinyQA JSON lines", convert_tinyqa_record))
    source_converter("tinyqa").prepare("tiny.jsonl", "data/tiny", split="dev")

RULER-HQA sets (``data.ruler``) are built from a prepared folder, not converted from a source
file, so they are no entry here.
"""

from __future__ import annotations

from memsearch.data import hotpot, musique
from memsearch.data.convert import SourceConverter
from memsearch.errors import InputValueError
from memsearch.registry import Registry

CONVERTERS: Registry[SourceConverter] = Registry("dataset converter")


def register_converter(converter: SourceConverter) -> SourceConverter:
    """Register ``converter`` under its ``name``; a name already taken is refused."""
    return CONVERTERS.register(converter.name, converter)


def unregister_converter(name: str) -> SourceConverter:
    """Remove a registered converter (a test's teardown)."""
    return CONVERTERS.unregister(name)


def converter_names() -> tuple[str, ...]:
    """The registered converters' names, in registration order."""
    return CONVERTERS.names()


def source_converter(name: str) -> SourceConverter:
    """The converter registered as ``name``; ``InputValueError`` listing the registered names
    (and what each reads) otherwise."""
    if name not in CONVERTERS:
        reads = "; ".join(f"{n}: {CONVERTERS.get(n).reads}" for n in CONVERTERS)
        raise InputValueError(CONVERTERS.problem(name) + (f" ({reads})" if reads else ""))
    return CONVERTERS.get(name)


register_converter(hotpot.CONVERTER)
register_converter(musique.CONVERTER)
