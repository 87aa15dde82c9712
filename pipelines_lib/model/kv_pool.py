"""The paged KV cache: a pool of fixed-size blocks per layer, stacked over layers, and how a step writes and reads it.

``KVCache`` holds keys and values as ``[n_layers, num_blocks, block_size, kv_heads, head_dim]``. A row's block table
(``table_bn``, one row per sequence) names the pool block holding its positions ``[j · block_size, (j + 1) ·
block_size)``; the id ``num_blocks`` (or more) is "no block": writes to it are dropped, reads of it are masked. The
decoder's layer scan carries the whole pool and each layer writes its own slice in place (``write_blocks``); XLA's
attention path then reads a row's blocks as one contiguous view (``gather_blocks``), the decode kernel
(``paged_attention``) reads them where they lie.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pipelines_lib.model.config import ModelConfig


class KVCache(NamedTuple):
    """Keys and values of every layer in blocks: ``[n_layers, num_blocks, block_size, kv_heads, head_dim]``."""

    k_lnskd: jax.Array
    v_lnskd: jax.Array


def init_cache(cfg: ModelConfig, num_blocks: int, block_size: int) -> KVCache:
    """Zeroed pool of ``num_blocks`` blocks of ``block_size`` positions per layer."""
    shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
    dtype = jnp.dtype(cfg.dtype)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def write_blocks(
    pool_lnskd: jax.Array, layer: jax.Array, new_btkd: jax.Array, positions_bt: jax.Array, table_bn: jax.Array
) -> jax.Array:
    """The pool with ``new`` written at each row's positions of ``layer``: position ``p`` of row ``b`` lives at
    offset ``p % block_size`` of block ``table_bn[b, p // block_size]``; positions at or past ``n · block_size``
    and table entries ``>= num_blocks`` ("no block") are dropped. A scatter into the stacked pool, the layer
    scan's carry, updated in place. One token a row (decode) is scattered by position; a chunk (consecutive
    positions, as prefill writes them) through the whole blocks it touches, gathered, overlaid and scattered
    back: a TPU's scatter pays per index (docs/TPU_PERF.md). The overlay is a select against the chunk shifted to each row's offset
    (one slice a row): an update at a per-row offset compiled, on the chip, to a loop over the rows."""
    num_blocks, block_size = pool_lnskd.shape[1:3]
    (b, t), n = positions_bt.shape, table_bn.shape[1]
    new_btkd = new_btkd.astype(pool_lnskd.dtype)

    def block_of(j_bx: jax.Array) -> jax.Array:  # each row's block at its block index j ("no block" past the table)
        return jnp.where(j_bx < n, jnp.take_along_axis(table_bn, jnp.minimum(j_bx, n - 1), axis=1), num_blocks)

    if t == 1:
        return pool_lnskd.at[layer, block_of(positions_bt // block_size), positions_bt % block_size].set(
            new_btkd, mode="drop")
    w = (block_size - 1 + t - 1) // block_size + 1  # blocks t consecutive positions can touch, at any offset
    offset_b1 = positions_bt[:, :1] % block_size
    j_w = jnp.arange(w)
    # A window block the chunk does not reach (the last, for a chunk ending early in the window) is not written.
    block_bw = jnp.where(j_w * block_size < offset_b1 + t, block_of(positions_bt[:, :1] // block_size + j_w),
                         num_blocks)
    # Row b's chunk starting at window position offset_b: a slice of the chunk padded by a block either side.
    padded_bpkd = jnp.pad(new_btkd, ((0, 0), (block_size, w * block_size - t), (0, 0), (0, 0)))
    shifted_bxkd = jax.vmap(lambda chunk, at: jax.lax.dynamic_slice_in_dim(chunk, at, w * block_size, 0))(
        padded_bpkd, block_size - offset_b1[:, 0])
    x_bx = jnp.arange(w * block_size) - offset_b1
    window_bxkd = jnp.where(((x_bx >= 0) & (x_bx < t))[:, :, None, None], shifted_bxkd,
                            gather_blocks(pool_lnskd, layer, block_bw))
    return pool_lnskd.at[layer, block_bw].set(window_bxkd.reshape(b, w, *pool_lnskd.shape[2:]), mode="drop")


def gather_blocks(pool_lnskd: jax.Array, layer: jax.Array, table_bn: jax.Array) -> jax.Array:
    """Each row's ``[n · block_size, kv_heads, head_dim]`` view of ``layer``'s table blocks (position ``s`` of the
    view holds position ``s``); blocks not assigned yet read some block, masked by causality."""
    b, n = table_bn.shape
    return pool_lnskd.at[layer, table_bn].get(mode="clip").reshape(b, n * pool_lnskd.shape[2], *pool_lnskd.shape[3:])
