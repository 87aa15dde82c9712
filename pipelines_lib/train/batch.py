"""The trainer's batch: right-padded arrays of static, bucketed shape.

``batch_from_groups`` turns whole GRPO groups as the tailer hands them out (Arrow rows of a shard) into a
``TrainBatch``, reading the token columns straight into numpy (no Python lists between shard and device);
``build_train_batch`` does the same from ragged Python rows (SFT demonstrations, tests, benchmarks). Both
pad through ``_padded``: the sequence length is the smallest bucket that fits and the row count is padded to
a fixed ``batch_size``. Shapes therefore come from a small fixed set, so the jitted train step compiles once
per bucket rather than once per batch.

Padding is inert by construction: padded tokens and padded rows have ``loss_mask == 0``, so every
aggregation in ``losses.py`` gives them zero weight and rows without a loss token are not counted
as sequences.

Alignment matches the trajectory schema: ``behav_logp_bt[:, t]`` is the sampler's log-prob of
``tokens_bt[:, t]`` given ``tokens_bt[:, :t]``; a loss token therefore never sits at ``t = 0``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from flax import struct

from pipelines_lib.train.advantages import compute_advantages
from pipelines_lib.trajectory.channel import GroupSlice


@struct.dataclass
class TrainBatch:
    """One training batch; a pytree, so it passes straight through ``nnx.jit``."""

    tokens_bt: jax.Array
    """int32 token ids, right-padded with ``pad_id``."""
    positions_bt: jax.Array
    """int32 position of each token in its row (``0..T-1``)."""
    loss_mask_bt: jax.Array
    """float32; 1.0 on tokens the policy generated, 0.0 elsewhere (prompt, tool output, padding)."""
    behav_logp_bt: jax.Array
    """float32 log-probs the sampler recorded for each token (0 off the loss mask)."""
    advantages_bt: jax.Array
    """float32 advantage of each token: the sequence's advantage broadcast over its row."""
    prox_logp_bt: jax.Array | None = None
    """Proximal log-probs (``step.logprobs_fn`` before the first update on this batch). ``None``
    means "the current parameters", which is exact when the batch gets one optimizer update."""

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens_bt.shape)


def bucket_length(length: int, seq_buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` tokens."""
    if not seq_buckets:
        raise ValueError("need at least one sequence bucket, got none")
    for bucket in sorted(seq_buckets):
        if length <= bucket:
            return bucket
    raise ValueError(f"a row of {length} tokens exceeds the largest sequence bucket {max(seq_buckets)}")


def _padded(lengths_n: np.ndarray, tokens_x: np.ndarray, mask_x: np.ndarray, logp_x: np.ndarray,
            advantages_n: np.ndarray, *, seq_buckets: Sequence[int], batch_size: int, pad_id: int) -> TrainBatch:
    """Rows given flat (``*_x``: every row's values one after another, ``lengths_n`` long each) → ``TrainBatch``."""
    n_rows = len(lengths_n)
    if n_rows == 0 or n_rows > batch_size:
        raise ValueError(f"need 1..batch_size={batch_size} rows, got {n_rows}")
    seq_len = bucket_length(int(lengths_n.max()), seq_buckets)
    starts_n = np.concatenate([[0], np.cumsum(lengths_n)[:-1]]).astype(np.int64)
    nonempty_n = np.flatnonzero(lengths_n > 0)
    loss_at_0 = nonempty_n[mask_x[starts_n[nonempty_n]] > 0]
    if len(loss_at_0):
        raise ValueError(f"row {loss_at_0[0]}: token 0 has no prefix to be scored from and cannot be a loss token")
    row_x = np.repeat(np.arange(n_rows), lengths_n)
    col_x = np.arange(len(tokens_x)) - np.repeat(starts_n, lengths_n)
    tokens_bt = np.full((batch_size, seq_len), pad_id, np.int32)
    loss_mask_bt = np.zeros((batch_size, seq_len), np.float32)
    behav_logp_bt = np.zeros((batch_size, seq_len), np.float32)
    advantages_bt = np.zeros((batch_size, seq_len), np.float32)
    tokens_bt[row_x, col_x] = tokens_x
    loss_mask_bt[row_x, col_x] = mask_x
    behav_logp_bt[row_x, col_x] = np.where(mask_x > 0, logp_x, 0.0)
    advantages_bt[row_x, col_x] = np.repeat(advantages_n, lengths_n)
    positions_bt = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len)).copy()
    return TrainBatch(tokens_bt=tokens_bt, positions_bt=positions_bt, loss_mask_bt=loss_mask_bt,
                      behav_logp_bt=behav_logp_bt, advantages_bt=advantages_bt)


def build_train_batch(
    tokens: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int | float]],
    behav_logps: Sequence[Sequence[float]] | None = None,
    advantages: Sequence[float] | None = None,
    *,
    seq_buckets: Sequence[int],
    batch_size: int | None = None,
    pad_id: int = 0,
) -> TrainBatch:
    """Pad ragged rows into a ``TrainBatch`` of shape ``[batch_size, bucket]`` (numpy arrays).

    Args:
      tokens, loss_masks, behav_logps: one list per row, of equal lengths within a row.
      advantages: one advantage per row, broadcast over the row's tokens.
        ``behav_logps`` and ``advantages`` default to zeros: the SFT (``nll``) loss ignores them.
      seq_buckets: allowed padded lengths; the smallest one that fits the longest row is used.
      batch_size: rows after padding with empty (all-masked) rows; defaults to the row count.
        Fix it (e.g. to ``n_groups · group_size``) so batches that lose groups keep their shape.
      pad_id: token id written into padding.
    """
    n_rows = len(tokens)
    behav_logps = [[0.0] * len(row) for row in tokens] if behav_logps is None else behav_logps
    advantages = [0.0] * n_rows if advantages is None else advantages
    if not n_rows == len(loss_masks) == len(behav_logps) == len(advantages):
        raise ValueError(
            f"row counts differ: tokens {n_rows}, loss_masks {len(loss_masks)}, "
            f"behav_logps {len(behav_logps)}, advantages {len(advantages)}"
        )
    for b, (row, mask, logp) in enumerate(zip(tokens, loss_masks, behav_logps, strict=True)):
        if not len(row) == len(mask) == len(logp):
            raise ValueError(f"row {b}: {len(row)} tokens but {len(mask)} mask entries and {len(logp)} logprobs")

    def flat(rows: Sequence[Sequence[float]], dtype: type) -> np.ndarray:
        return np.fromiter((x for row in rows for x in row), dtype)

    return _padded(np.fromiter(map(len, tokens), np.int64, n_rows), flat(tokens, np.int64), flat(loss_masks, np.float32),
                   flat(behav_logps, np.float32), np.asarray(advantages, np.float32), seq_buckets=seq_buckets,
                   batch_size=n_rows if batch_size is None else batch_size, pad_id=pad_id)


_COLUMNS = ("tokens", "loss_mask", "logprobs", "reward", "sample_idx")


def _in_sample_order(g: GroupSlice, group_size: int) -> pa.Table:
    table = g.table.select(_COLUMNS)
    if table.num_rows != group_size:
        raise ValueError(f"{g.shard} rows [{g.row_start}, {g.row_end}): group {g.group_id} has "
                         f"{table.num_rows} samples, the campaign's group_size is {group_size}")
    return table.take(pc.sort_indices(table, [("sample_idx", "ascending")]))


def batch_from_groups(groups: Sequence[GroupSlice], *, group_size: int, advantage: str,
                      seq_buckets: Sequence[int], batch_size: int, pad_id: int) -> tuple[TrainBatch, int]:
    """Whole groups of ``group_size`` samples → (TrainBatch of ``batch_size`` rows, loss tokens); advantages per
    group from the ``advantage`` estimator (exactly zero for an all-equal group, ``window.zero_advantage``).
    Rows are in group order, then sample order; the token columns go from Arrow to numpy without Python lists."""
    table = pa.concat_tables([_in_sample_order(g, group_size) for g in groups]).combine_chunks()
    rewards_gk = table.column("reward").to_numpy().astype(np.float32).reshape(len(groups), group_size)
    advantages_gk, _ = compute_advantages(rewards_gk, estimator=advantage)

    def values(name: str) -> np.ndarray:
        return pc.list_flatten(table.column(name)).to_numpy()

    mask_x = values("loss_mask").astype(np.float32)
    batch = _padded(pc.list_value_length(table.column("tokens")).to_numpy().astype(np.int64), values("tokens"),
                    mask_x, values("logprobs"), np.asarray(advantages_gk).reshape(-1), seq_buckets=seq_buckets,
                    batch_size=batch_size, pad_id=pad_id)
    return batch, int(mask_x.sum())
