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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_MODULES: tuple[str, ...] = (
    "bench.ablation",
    "bench.campaign_arms",
    "bench.engine",
    "bench.learning",
    "bench.learning2",
    "bench.realsize",
    "bench.replay",
    "bench.rollout",
    "bench.scale",
    "bench.sql",
    "bench.store",
    "bench.storage_scale",
    "bench.telemetry",
    "bench.tpu",
    "bench.tpu_ablation",
    "bench.tpu_real",
    "bench.tpu_tier",
    "bench.tpu_warm_start",
    "bench.trainer",
    "bench.vllm",
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
    seeds: tuple[int, ...] | None = None
    """The seeds a benchmark that repeats its campaign per seed runs (``--seeds N`` is 0..N-1, ``--seeds A..B`` is A
    to B inclusive); None: its own default."""
    budget_s: float | None = None
    """Seconds this run may take (``--budget-s``): a benchmark made of resumable parts starts no part it does not
    expect to finish in what is left; None: no limit."""

    arms: tuple[str, ...] | None = None
    """The arms a benchmark made of arms runs (``--arms``, the ablation); None: all of them."""
    preset: str | None = None
    """The campaign preset a benchmark that runs the demo command starts from (``--preset``, the learning
    benchmark; a recipe of ``recipes/``, ``pipelines_lib.config.preset_names()``); None: ``make demo``'s, ``pipelines_lib.config.DEMO_PRESET``."""

    def seed_list(self, default: int) -> tuple[int, ...]:
        """``seeds`` if given, else seeds 0 to ``default`` - 1."""
        return tuple(range(default)) if self.seeds is None else self.seeds


class Budget:
    """What is left of a benchmark's ``budget_s`` (None: no limit) for its resumable runs, counted from when this
    was made: a run is started only if it is expected to finish, with a tenth to spare."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def affords(self, cost_s: float) -> bool:
        """Whether a run expected to take ``cost_s`` seconds (at least one) fits in what is left."""
        return self.seconds is None or self.seconds - (time.monotonic() - self.started) >= 1.1 * max(cost_s, 1.0)


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
    labels: dict[str, str] = field(default_factory=dict)
    """Text figures, keyed like ``figures`` (``tpu.device``: the chip the figures were measured on)."""


class PartialResult(Exception):  # noqa: N818 - a result, carried by the error that cut the run short
    """Raised by a benchmark whose later part failed after earlier parts measured figures: the runner records
    ``result`` (its notes say what failed), then lets this error propagate. Raise it ``from`` the part's error."""

    def __init__(self, result: BenchResult, failed: str) -> None:
        super().__init__(failed)
        self.result = result


class BenchSkipped(Exception):  # noqa: N818 - an outcome, not a failure
    """Raised by a benchmark that cannot measure on this machine (one that needs an accelerator, on a CPU): the
    runner prints the reason and records nothing, so the figures of an earlier run on the right machine stay."""


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
    prefixes: tuple[str, ...] = ()
    """Key prefixes this benchmark owns besides ``<name>.`` (a figure named after what it measures, e.g.
    ``engine.vllm.``, written by a benchmark of its own); the longest matching prefix owns a key."""

    def owned_prefixes(self) -> tuple[str, ...]:
        return (f"{self.name}.", *self.prefixes)


BENCHES: dict[str, Bench] = {}


def register_bench(name: str, *, title: str, measures: str, method: str, goals: tuple[Goal, ...] = (),
                   prefixes: tuple[str, ...] = ()) -> Callable[[BenchFn], BenchFn]:
    if not name.isidentifier():
        raise ValueError(f"benchmark name must be an identifier, got {name!r}")
    for g in goals:
        if not g.key.startswith((f"{name}.", *prefixes)):
            raise ValueError(f"benchmark {name!r}: goal key {g.key!r} must start with one of "
                             f"{[f'{name}.', *prefixes]}")

    def register(fn: BenchFn) -> BenchFn:
        if name in BENCHES:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHES[name] = Bench(name=name, title=title, measures=measures, method=method, goals=goals, fn=fn,
                              prefixes=prefixes)
        return fn
    return register


def key_owner(key: str, benches: dict[str, Bench]) -> str:
    """Name of the benchmark owning figure ``key``: the longest owned prefix it starts with, else the part
    before its first dot (figures of no registered benchmark, or of another command)."""
    matches = [(len(p), b.name) for b in benches.values() for p in b.owned_prefixes() if key.startswith(p)]
    return max(matches)[1] if matches else key.split(".", 1)[0]


def load_benches() -> dict[str, Bench]:
    for module in BENCH_MODULES:
        importlib.import_module(module)
    return BENCHES
