"""Per-trajectory figures of one shard, and the summary statistics the audit reports over a whole campaign.

``shard_figures`` turns one shard's table into flat per-trajectory arrays (reward, lengths, turn counts) and
counters (statuses, tool calls, tool errors) with vectorised Arrow/NumPy code, so auditing a large campaign
costs one pass over its bytes. ``Distribution`` accumulates those arrays across shards; ``summarize`` turns
them into the ``Summary`` the report prints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


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
    if values.size == 0:
        return Summary(count=0, mean=None, p50=None, p95=None, max=None)
    v = values.astype(np.float64)
    return Summary(count=int(v.size), mean=float(v.mean()), p50=float(np.percentile(v, 50)),
                   p95=float(np.percentile(v, 95)), max=float(v.max()))


@dataclass(frozen=True, kw_only=True)
class ShardFigures:
    """One value per trajectory (row order) plus counters, for one shard."""

    reward: np.ndarray
    tokens: np.ndarray
    """Sequence length (prompt, generated, tool and env tokens)."""
    generated_tokens: np.ndarray
    """Tokens under the loss mask: what the policy generated."""
    turns: np.ndarray
    statuses: Counter[str]
    tool_calls: Counter[str]
    """Tool turns by tool name."""
    tool_errors: Counter[tuple[str, str]]
    """(tool name, error kind) of tool turns that record an error."""


def _per_row_sum(col: pa.ChunkedArray, n_rows: int) -> np.ndarray:
    arr = col.combine_chunks()
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    return np.bincount(parents, weights=values, minlength=n_rows)


def _lengths(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def shard_figures(table: pa.Table) -> ShardFigures:
    n = table.num_rows
    turns = table.column("turns").combine_chunks()
    flat_turns = pc.list_flatten(turns)
    is_tool = pc.equal(flat_turns.field("role"), "tool")
    tool_names = pc.filter(flat_turns.field("tool_name"), is_tool).to_pylist()
    errors = pc.filter(flat_turns.field("error"), is_tool).to_pylist()
    return ShardFigures(
        reward=table.column("reward").to_numpy().astype(np.float64),
        tokens=_lengths(table.column("tokens")),
        generated_tokens=_per_row_sum(table.column("loss_mask"), n).astype(np.int64),
        turns=_lengths(turns),
        statuses=Counter(table.column("status").to_pylist()),
        tool_calls=Counter(name or "?" for name in tool_names),
        tool_errors=Counter((name or "?", err) for name, err in zip(tool_names, errors, strict=True) if err),
    )


@dataclass
class Distribution:
    """Per-trajectory values over many shards, kept as value -> count: memory follows the distinct values (lengths
    up to the longest bucket, turn counts, the reward levels a task gives), not the number of trajectories, and two
    distributions merge by adding counts (the audit's per-version work units)."""

    counts: Counter[float] = field(default_factory=Counter)

    def add(self, values: np.ndarray) -> None:
        # Counter over the plain floats: a shard holds a few rows, and np.unique's sort costs more than counting.
        self.counts.update(values.astype(np.float64).tolist())

    def merge(self, other: Distribution) -> None:
        self.counts.update(other.counts)

    def summary(self) -> Summary:
        """``summarize`` of the values (same percentiles), from the counts."""
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
