"""Figures over seeds: what a benchmark that repeats a campaign per seed reports, and what a claim needs.

One run of a learning campaign is one draw: its warm start, its tasks, its sampling and (asynchronous rollout)
its timing all move the ending by several points. A benchmark that repeats its campaign over ``seeds`` reports, per
figure, the mean, the minimum, the spread (max − min) and a 95 % Student-t interval of the mean; a comparison of two
arms is stated only where the interval of their paired difference says so (``Claim``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

DEFAULT_LEVEL = 0.95
"""Confidence of every interval."""


def seed_overrides(seed: int) -> dict[str, int]:
    """The config values one campaign seed sets: rollout and evaluation sampling, the dataset, the warm start and
    the trainer."""
    return {"seed": seed, "dataset.seed": seed, "sft.seed": seed, "trainer.seed": seed}


def seed_args(seed: int) -> list[str]:
    """``seed_overrides`` as ``--set k=v`` arguments of the campaign command."""
    return [a for k, v in seed_overrides(seed).items() for a in ("--set", f"{k}={v}")]


@dataclass(frozen=True)
class OverSeeds:
    """One figure measured once per seed."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or not all(math.isfinite(v) for v in self.values):
            raise ValueError(f"OverSeeds needs one finite value per seed, got {self.values}")

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def spread(self) -> float:
        return max(self.values) - min(self.values)

    def interval(self, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
        """Student-t interval of the mean (one seed: the value itself, no width to speak of)."""
        n = len(self.values)
        if n == 1:
            return self.values[0], self.values[0]
        half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(self.values) / math.sqrt(n)
        return self.mean - half, self.mean + half

    def figures(self, key: str) -> dict[str, float]:
        """``key`` (the mean), ``key_min``, ``key_spread``, ``key_ci_low``, ``key_ci_high``."""
        low, high = self.interval()
        return {
            key: round(self.mean, 2),
            f"{key}_min": round(self.min, 2),
            f"{key}_spread": round(self.spread, 2),
            f"{key}_ci_low": round(low, 2),
            f"{key}_ci_high": round(high, 2),
        }

    def text(self, unit: str = "") -> str:
        low, high = self.interval()
        return (
            f"{self.mean:.1f}{unit} (95 % CI {low:.1f} to {high:.1f}; min {self.min:.1f}, spread "
            f"{self.spread:.1f}; n = {len(self.values)})"
        )


@dataclass(frozen=True)
class Claim:
    """``a − b <= bound`` (``within``) or ``a − b > 0`` (``worse``: b ends below a), judged on the paired
    per-seed differences: supported when the whole 95 % interval of the mean difference satisfies it (never on one
    seed, which has no interval)."""

    text: str
    differences: OverSeeds
    supported: bool
    unit: str = " pts"
    """How ``render`` writes the differences (a ratio claim's are ``×``)."""
    measure: str = "difference"
    """What ``render`` calls the paired values (a ratio claim's: ``ratio``)."""

    @classmethod
    def within(cls, text: str, a: Sequence[float], b: Sequence[float], bound: float) -> Claim:
        diff = OverSeeds(tuple(x - y for x, y in zip(a, b, strict=True)))
        return cls(text, diff, len(diff.values) > 1 and diff.interval()[1] <= bound)

    @classmethod
    def worse(cls, text: str, a: Sequence[float], b: Sequence[float]) -> Claim:
        diff = OverSeeds(tuple(x - y for x, y in zip(a, b, strict=True)))
        return cls(text, diff, len(diff.values) > 1 and diff.interval()[0] > 0)

    def render(self) -> str:
        if len(self.differences.values) < 2:  # one seed has no interval: nothing is judged yet
            return f"{self.text}: open, one paired seed ({self.measure} {self.differences.values[0]:.1f}{self.unit})"
        verdict = "supported" if self.supported else "NOT supported by the interval"
        return f"{self.text}: {verdict} ({self.measure} {self.differences.text(self.unit)})"


__all__ = ["Claim", "DEFAULT_LEVEL", "OverSeeds", "seed_args", "seed_overrides"]
