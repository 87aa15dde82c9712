"""Figures for BENCHMARKS.md: one headless matplotlib figure per plot, saved and closed in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def figure(path: Path, *, figsize: tuple[float, float], dpi: int = 110, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``(fig, axes)`` of ``plt.subplots(**subplots)``, laid out and saved to ``path`` when the block ends.

    matplotlib is imported here, not at module load: the benchmarks that plot nothing never pay for it."""
    import matplotlib

    matplotlib.use("Agg")  # benchmarks run without a display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=figsize, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def barh(path: Path, labels: Sequence[str], values: Sequence[float], *, colors: Sequence[str] | str,
         xlabel: str, title: str, figsize: tuple[float, float]) -> None:
    """One horizontal bar per label, the first on top."""
    with figure(path, figsize=figsize) as (_, ax):
        ax.barh(list(labels), list(values), color=colors)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title)
