"""The trainer's batch: right-padded arrays of static, bucketed shape.

``build_train_batch`` turns ragged host rows (token ids, loss masks, behaviour log-probs and one
advantage per sequence, as read from trajectory shards) into a ``TrainBatch`` whose sequence length
is the smallest bucket that fits and whose row count is padded to a fixed ``batch_size``. Shapes
therefore come from a small fixed set, so the jitted train step compiles once per bucket rather
than once per batch.

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
from flax import struct


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
    batch_size = n_rows if batch_size is None else batch_size
    if n_rows == 0 or n_rows > batch_size:
        raise ValueError(f"need 1..batch_size={batch_size} rows, got {n_rows}")
    seq_len = bucket_length(max(len(row) for row in tokens), seq_buckets)

    tokens_bt = np.full((batch_size, seq_len), pad_id, np.int32)
    loss_mask_bt = np.zeros((batch_size, seq_len), np.float32)
    behav_logp_bt = np.zeros((batch_size, seq_len), np.float32)
    advantages_bt = np.zeros((batch_size, seq_len), np.float32)
    for b, (row, mask, logp, advantage) in enumerate(
        zip(tokens, loss_masks, behav_logps, advantages, strict=True)
    ):
        n = len(row)
        if not n == len(mask) == len(logp):
            raise ValueError(f"row {b}: {n} tokens but {len(mask)} mask entries and {len(logp)} logprobs")
        if n and mask[0]:
            raise ValueError(f"row {b}: token 0 has no prefix to be scored from and cannot be a loss token")
        tokens_bt[b, :n] = row
        loss_mask_bt[b, :n] = mask
        behav_logp_bt[b, :n] = np.where(np.asarray(mask) > 0, logp, 0.0)
        advantages_bt[b, :n] = advantage
    positions_bt = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch_size, seq_len)).copy()
    return TrainBatch(
        tokens_bt=tokens_bt,
        positions_bt=positions_bt,
        loss_mask_bt=loss_mask_bt,
        behav_logp_bt=behav_logp_bt,
        advantages_bt=advantages_bt,
    )
