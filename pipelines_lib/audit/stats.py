"""The summary statistics the audit reports over a whole campaign.

``Distribution`` accumulates per-trajectory values across shards (``worker.shard_figures`` computes them per shard)
as value -> count; ``summarize`` turns values into the ``Summary`` the report prints. NumPy is imported where it
is used: the audit's merging process imports this module while its workers run, and needs NumPy only for the
report, once they are gone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, kw_only=True)
class Summary:
    """count / mean / median / 95th percentile / max of one quantity (None when there are no values)."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    max: float | None


def summarize(values: np.ndarray) -> Summary:
    """Percentiles use linear interpolation between order statistics (NumPy's default)."""
    import numpy as np

    if values.size == 0:
        return Summary(count=0, mean=None, p50=None, p95=None, max=None)
    v = values.astype(np.float64)
    return Summary(count=int(v.size), mean=float(v.mean()), p50=float(np.percentile(v, 50)),
                   p95=float(np.percentile(v, 95)), max=float(v.max()))


@dataclass
class Distribution:
    """Per-trajectory values over many shards, kept as value -> count: memory follows the distinct values (lengths
    up to the longest bucket, turn counts, the reward levels a task gives), not the number of trajectories, and two
    distributions merge by adding counts (the audit's per-version work units)."""

    counts: Counter[float] = field(default_factory=Counter)

    def add(self, values: np.ndarray) -> None:
        # Counter over the plain floats: a shard holds a few rows, and np.unique's sort costs more than counting.
        self.counts.update(values.astype("float64").tolist())

    def merge(self, other: Distribution) -> None:
        self.counts.update(other.counts)

    def summary(self) -> Summary:
        """``summarize`` of the values (same percentiles), from the counts."""
        import numpy as np

        if not self.counts:
            return summarize(np.empty(0))
        values = np.array(sorted(self.counts), np.float64)
        counts = np.array([self.counts[v] for v in values.tolist()], np.int64)
        n = int(counts.sum())
        ends = np.cumsum(counts)  # the value at sorted rank k is values[searchsorted(ends, k, side="right")]

        def at(rank: int) -> float:
            return float(values[np.searchsorted(ends, rank, side="right")])

        def percentile(q: float) -> float:
            # NumPy's "linear" method: rank q(n-1), interpolated as np.percentile does (its _lerp).
            pos = q / 100 * (n - 1)
            lo, t = int(np.floor(pos)), pos - np.floor(pos)
            a, b = at(lo), at(min(lo + 1, n - 1))
            return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t

        return Summary(count=n, mean=float(values @ counts) / n, p50=percentile(50), p95=percentile(95),
                       max=float(values[-1]))
