"""The benchmark registry.

A benchmark is a function ``fn(ctx: BenchContext) -> BenchResult`` registered under a name with the text its
``BENCHMARKS.md`` section needs (what it measures, how) and its goals. Its figures are flat keys prefixed
with its name (``store.write_over_pyarrow``) so results of all benchmarks share one flat namespace.

Benchmarks live in this package, outside the library they measure; the runner
imports every module in ``BENCH_MODULES`` before it looks names up, so registering a new one means adding its
module name there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_MODULES: tuple[str, ...] = (
    "bench.campaign_arms",
    "bench.engine",
    "bench.learning",
    "bench.realsize",
    "bench.rollout",
    "bench.store",
    "bench.telemetry",
    "bench.trainer",
)
"""Modules whose import registers benchmarks."""


@dataclass(frozen=True, kw_only=True)
class Goal:
    """A target for one figure, e.g. ``store.read_over_pyarrow >= 0.8``."""

    key: str
    op: str
    """``>=`` or ``<=``."""
    value: float
    why: str = ""

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise ValueError(f"Goal.op must be '>=' or '<=', got {self.op!r}")

    def met(self, x: float) -> bool:
        return x >= self.value if self.op == ">=" else x <= self.value

    def __str__(self) -> str:
        return f"{'≥' if self.op == '>=' else '≤'} {self.value:g}"


@dataclass(frozen=True, kw_only=True)
class BenchContext:
    quick: bool
    """Small sizes: the benchmark must finish in seconds."""
    plot_dir: Path
    """Where plot files go (``bench/``); ``BenchResult.plots`` names files in it."""
    scratch: Path
    """An empty folder, removed after the benchmark (local storage backend for IO benchmarks)."""
    progress: Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    figures: dict[str, float]
    """Flat keys, each starting with ``<benchmark name>.``."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Rows of the Markdown table (same keys in every row; the first row's keys are the columns)."""
    plots: list[str] = field(default_factory=list)
    """File names in ``BenchContext.plot_dir``."""
    notes: str = ""
    """Run-specific remarks (sizes used, anything odd), printed under the table."""


BenchFn = Callable[[BenchContext], BenchResult]


@dataclass(frozen=True, kw_only=True)
class Bench:
    name: str
    title: str
    measures: str
    """What is measured, in one or two sentences."""
    method: str
    """How: sizes, repetitions, what is timed and what is not."""
    goals: tuple[Goal, ...]
    fn: BenchFn


BENCHES: dict[str, Bench] = {}


def register_bench(name: str, *, title: str, measures: str, method: str,
                   goals: tuple[Goal, ...] = ()) -> Callable[[BenchFn], BenchFn]:
    if not name.isidentifier():
        raise ValueError(f"benchmark name must be an identifier, got {name!r}")
    for g in goals:
        if not g.key.startswith(f"{name}."):
            raise ValueError(f"benchmark {name!r}: goal key {g.key!r} must start with '{name}.'")

    def register(fn: BenchFn) -> BenchFn:
        if name in BENCHES:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHES[name] = Bench(name=name, title=title, measures=measures, method=method, goals=goals, fn=fn)
        return fn
    return register


def load_benches() -> dict[str, Bench]:
    for module in BENCH_MODULES:
        importlib.import_module(module)
    return BENCHES
