"""Measured figures in prose documents, read from the one record of them, ``bench/results.json``.

A document quotes a figure in one of two forms, both tied to a key of the record:

- a **block** that ``rollstream bench`` re-renders after every benchmark it runs::

      <!-- figures: tpu.campaign_wall_s tpu.campaign_gain_pts -->
      | figure | value |
      ...
      <!-- /figures -->

- a **citation** inline: a number, an optional unit, and the key in backticks and parentheses, such as
  ``187 s (`tpu.campaign_wall_s`)``. A ``%`` after the number reads the recorded fraction times 100. The number
  must equal the recorded value at the precision it is written with.

``rerender`` rewrites the blocks of a text (pure); ``problems`` lists every block that differs from its rendering and
every citation of a key the record lacks or of another value, each naming the line. The runner
(``bench.runner.run_benchmarks``) rewrites the documents in ``DOCUMENTS``; ``tests/test_figures.py`` holds the
repository's documents to the record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DOCUMENTS = ("README.md", "docs/*.md")
"""The documents, as globs under the repository root, whose figures come from the record."""

BLOCK = re.compile(r"<!-- figures: ([^>]*?) -->\n(.*?)<!-- /figures -->", re.S)
CITATION = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?)(?:\s?(%|[A-Za-zµ/]+))?\s\(`([a-z][\w-]*(?:\.[\w-]+)+)`\)")
"""A number, an optional unit and a record key in backticks within parentheses."""


def format_value(value: Any) -> str:
    """A recorded figure as documents show it: four significant digits; a label as it is."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _recorded(results: Mapping[str, Any]) -> dict[str, Any]:
    return {**results.get("figures", {}), **results.get("labels", {})}


def render_block(keys: list[str], recorded: Mapping[str, Any]) -> str:
    """The table a block of these keys holds; a key the record lacks shows as ``missing``."""
    rows = [f"| `{k}` | {format_value(recorded[k]) if k in recorded else 'missing'} |" for k in keys]
    return "\n".join(["| figure | value |", "|---|---|", *rows]) + "\n"


def rerender(text: str, results: Mapping[str, Any]) -> str:
    """``text`` with every figures block rendered from ``results`` (the record's parsed form)."""
    recorded = _recorded(results)
    return BLOCK.sub(lambda m: f"<!-- figures: {m.group(1)} -->\n{render_block(m.group(1).split(), recorded)}"
                               "<!-- /figures -->", text)


def _matches(cited: str, unit: str | None, value: Any) -> bool:
    if not isinstance(value, int | float):
        return False
    number = float(cited.replace(",", ""))
    decimals = len(cited.split(".", 1)[1]) if "." in cited else 0
    scaled = value * 100 if unit == "%" else value
    return abs(scaled - number) <= 0.5 * 10**-decimals + 1e-9  # the value rounds to the number as written


def problems(text: str, results: Mapping[str, Any], where: str) -> list[str]:
    """What in ``text`` (named ``where``) disagrees with the record: one line each, naming the line number."""
    recorded = _recorded(results)
    out = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        keys = m.group(1).split()
        for key in keys:
            if key not in recorded:
                out.append(f"{where}:{line}: figures block names {key!r}, which bench/results.json does not record")
        if keys and m.group(2) != render_block(keys, recorded):
            out.append(f"{where}:{line}: figures block differs from bench/results.json (run `rollstream bench` "
                       "or re-render it with bench.figures.rerender)")
    for m in CITATION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        cited, unit, key = m.groups()
        if key not in recorded:
            out.append(f"{where}:{line}: cites {key!r}, which bench/results.json does not record")
        elif not _matches(cited, unit, recorded[key]):
            out.append(f"{where}:{line}: cites {cited}{' ' + unit if unit else ''} for {key!r}, "
                       f"recorded {format_value(recorded[key])}")
    return out


def documents(root: Path) -> list[Path]:
    """The documents under ``root`` whose figures come from the record, in a stable order."""
    return sorted({p for pattern in DOCUMENTS for p in root.glob(pattern)})
