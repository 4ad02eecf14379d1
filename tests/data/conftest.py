"""Fixtures shared by the converter tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _write_pretty(path: Path, records: list) -> list[int]:
    """Write ``records`` as a JSON list indented by 2; returns the line each record starts on."""
    text = json.dumps(records, indent=2)
    path.write_text(text, encoding="utf-8")
    return [n for n, line in enumerate(text.split("\n"), start=1) if line == "  {"]


@pytest.fixture()
def pretty():
    """``pretty(path, records)``: a pretty-printed source file with known record start lines."""
    return _write_pretty
