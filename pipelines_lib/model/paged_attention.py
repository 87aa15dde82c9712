"""Decode attention over the paged KV cache, read in place: a Pallas TPU kernel.

A decode step has one query per row, and its cost is reading every row's keys and values once. XLA's path
(``kv_pool.write_blocks``, ``gather_blocks``, then ``attention.attention``) first copies each row's table blocks into a
contiguous ``[rows, span, ...]`` array and then attends over the copy: per layer, the keys/values cross memory
twice and the copy runs below the bandwidth of a plain read. ``paged_decode_attention`` computes the same
function from the pool itself:

* one grid step per row; the row's blocks (those holding positions up to its query's, as its table names them)
  are copied from HBM into vector memory with one DMA each, the next row's copies started before this row is
  computed (two buffers), so a row's copies overlap the row before's compute;
* all query heads at once against all of a block's ``block_size · kv_heads`` key rows (a block
  ``[block_size, kv_heads, head_dim]`` read as one ``[keys, head_dim]`` matrix: the same bytes when ``kv_heads`` is
  a multiple of 8, the rows of the chip's memory tiles): two plain matmuls a row, the scores of a query head
  against the other heads' keys masked out with the positions past the query's, outside the sliding window, or in
  blocks not copied. The masked-out work is waste, and it is what bounds the kernel when a span bucket reaches far
  past its rows' positions (docs/TPU_PERF.md).

The layer is an argument (the pools are stacked over layers and stay whole in HBM: the layer scan passes its
carry, nothing is sliced or copied). Rows whose table names no block (``num_blocks`` or more: padding rows, rows
that stopped) copy nothing and return zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MAX_COPY_BYTES = 8 * 2**20
"""Most vector memory the kernel's copies may take (``copy_bytes``): 8 MiB, a span of 1,024 positions of 8 kv heads
of 128 in bfloat16, as compiled and run on a TPU v5e. Longer spans are gathered instead (``attention.use_flash``)."""


def copy_bytes(span_positions: int, kv_heads: int, head_dim: int, dtype: jnp.dtype | str) -> int:
    """Vector memory of the kernel's copies over a span: keys and values of two rows (this one and the next)."""
    return 2 * 2 * span_positions * kv_heads * head_dim * jnp.dtype(dtype).itemsize


def _kernel(layer_ref: jax.Array, window_ref: jax.Array, table_ref: jax.Array, pos_ref: jax.Array,
            kpos_ref: jax.Array, kvh_ref: jax.Array, q_ref: jax.Array, k_hbm: jax.Array, v_hbm: jax.Array,
            o_ref: jax.Array, kbuf: jax.Array, vbuf: jax.Array, sem: jax.Array, *,
            span: int, block_size: int, num_blocks: int, group: int, scale: float, softcap: float | None) -> None:
    row, rows = pl.program_id(0), pl.num_programs(0)
    layer = layer_ref[0]

    def copied(r: jax.Array) -> jax.Array:
        """How many leading table blocks row ``r`` reads: those up to its query's position that name a block."""
        wanted = jnp.minimum(pos_ref[r] // block_size + 1, span)
        return jax.lax.fori_loop(0, wanted, lambda j, n: n + (n == j) * (table_ref[r * span + j] < num_blocks),
                                 jnp.int32(0))

    def dmas(r: jax.Array, slot: jax.Array, j: jax.Array) -> tuple[pltpu.AsyncCopyDescriptor, ...]:
        block = table_ref[r * span + j]
        return (pltpu.make_async_copy(k_hbm.at[layer, block], kbuf.at[slot, j], sem.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[layer, block], vbuf.at[slot, j], sem.at[1, slot]))

    def start(r: jax.Array, slot: jax.Array) -> None:
        @pl.loop(0, copied(r))
        def _(j: jax.Array) -> None:
            for dma in dmas(r, slot, j):
                dma.start()

    @pl.when(row == 0)
    def _() -> None:
        # Buffer rows no copy reaches are multiplied by zero probabilities: zeros, not whatever memory held.
        vbuf[...] = jnp.zeros_like(vbuf)
        start(row, 0)

    slot = row % 2

    @pl.when(row + 1 < rows)
    def _() -> None:
        start(row + 1, 1 - slot)

    n = copied(row)

    @pl.loop(0, n)
    def _(j: jax.Array) -> None:
        for dma in dmas(row, slot, j):
            dma.wait()

    k_xd = kbuf[slot].reshape(-1, kbuf.shape[-1])
    v_xd = vbuf[slot].reshape(-1, vbuf.shape[-1])
    q_hd = q_ref[0]
    s_hx = jax.lax.dot_general(q_hd, k_xd, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        s_hx = softcap * jnp.tanh(s_hx / softcap)
    pos = pos_ref[row]
    kpos_1x = kpos_ref[...]
    head_h1 = jax.lax.broadcasted_iota(jnp.int32, (q_hd.shape[0], 1), 0) // group
    visible = ((kvh_ref[...] == head_h1) & (kpos_1x <= pos) & (pos - kpos_1x < window_ref[0])
               & (kpos_1x < n * block_size))
    s_hx = jnp.where(visible, s_hx, jnp.finfo(jnp.float32).min)
    p_hx = jnp.exp(s_hx - jnp.max(s_hx, axis=1, keepdims=True))
    p_hx = jnp.where(visible, p_hx, 0.0)  # a row with nothing visible attends to nothing
    o_hd = jnp.dot(p_hx.astype(v_xd.dtype), v_xd, preferred_element_type=jnp.float32)
    o_ref[0] = (o_hd / jnp.maximum(jnp.sum(p_hx, axis=1, keepdims=True), 1e-30)).astype(o_ref.dtype)


def paged_decode_attention(
    q_rhd: jax.Array, k_pool: jax.Array, v_pool: jax.Array, layer: jax.Array, table_rn: jax.Array,
    positions_r: jax.Array, window: int | jax.Array | None, *, scale: float, softcap: float | None = None,
) -> jax.Array:
    """softmax(mask(cap(scale · q kᵀ))) v of one query per row (``q_rhd``, at ``positions_r``) over the keys and
    values of layer ``layer`` that the row's table blocks hold (``k_pool``/``v_pool``:
    ``KVCache``'s ``[n_layers, num_blocks, block_size, kv_heads, head_dim]``), causal by position and within
    ``window`` positions (None: no window), as ``attention.attention`` over ``gather_blocks``' view computes it. Rows
    with nothing visible (no block) give zeros. On a CPU it runs under ``pltpu.force_tpu_interpret_mode()`` only
    (the tests)."""
    rows, heads, head_dim = q_rhd.shape
    n_layers, num_blocks, block_size, kv_heads = k_pool.shape[:4]
    span, keys_per_block = table_rn.shape[1], block_size * kv_heads
    # Per key row of the copied blocks (block, offset, kv head): its position and its kv head.
    x = np.arange(span * keys_per_block)
    kpos_1x = jnp.asarray((x // keys_per_block * block_size + x % keys_per_block // kv_heads)[None], jnp.int32)
    kvh_1x = jnp.asarray((x % kv_heads)[None], jnp.int32)
    kernel = functools.partial(_kernel, span=span, block_size=block_size, num_blocks=num_blocks,
                               group=heads // kv_heads, scale=scale, softcap=softcap)
    per_row = pl.BlockSpec((1, heads, head_dim), lambda r, *_: (r, 0, 0))
    whole = pl.BlockSpec((1, span * keys_per_block), lambda r, *_: (0, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    buffer = pltpu.VMEM((2, span, keys_per_block, head_dim), k_pool.dtype)
    call = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(rows,), in_specs=[whole, whole, per_row, hbm, hbm], out_specs=per_row,
            scratch_shapes=[buffer, buffer, pltpu.SemaphoreType.DMA((2, 2))]),
        out_shape=jax.ShapeDtypeStruct(q_rhd.shape, q_rhd.dtype),
        # Row r + 1's copies are started in row r's step: the steps must run in order.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )
    unbounded = np.iinfo(np.int32).max
    scalars = (jnp.reshape(layer, (1,)).astype(jnp.int32),
               jnp.reshape(unbounded if window is None else window, (1,)).astype(jnp.int32),
               table_rn.reshape(-1).astype(jnp.int32), positions_r.astype(jnp.int32))
    pools = (pool.reshape(n_layers, num_blocks, keys_per_block, head_dim) for pool in (k_pool, v_pool))
    return call(*scalars, kpos_1x, kvh_1x, q_rhd, *pools)
