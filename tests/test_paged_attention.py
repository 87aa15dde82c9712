"""The paged decode kernel (``model.paged_attention``) against XLA's gather-then-attend path, run as Python on the
CPU (Pallas' TPU interpret mode simulates its copies and semaphores); on a TPU the same comparison runs compiled."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from pipelines_lib.model import attention as attention_module
from pipelines_lib.model.attention import attention, use_flash
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.kv_pool import KVCache, gather_blocks, init_cache
from pipelines_lib.model.paged_attention import paged_decode_attention

NO_BLOCK = 20
# The kernel's shapes as a model it serves has them (8 kv heads of 128, two query heads each): compiled on a chip it
# reads a block [positions, kv heads, head dim] as a [positions · kv heads, head dim] matrix, the same memory only
# when a position's kv heads fill the rows of the chip's (8, 128) tiles (``attention.flash_unsupported``).
LAYERS, BLOCKS, KV_HEADS, BLOCK_SIZE, HEAD_DIM, HEADS = 3, NO_BLOCK, 8, 4, 128, 16
SCALE = HEAD_DIM**-0.5
# Five rows over tables of four blocks: blocks in any order, one shared by two rows (block 7), a row whose last
# blocks are not assigned yet, a row with no block (padding, or a row that stopped), one exactly at a block's
# last position, one at position 0.
TABLE = np.array([[3, 7, 1, 0], [5, 7, NO_BLOCK, NO_BLOCK], [NO_BLOCK] * 4, [9, 10, 11, 12], [2, 4, 8, 13]], np.int32)
POSITIONS = np.array([9, 5, 3, 15, 0], np.int32)
LIVE = np.array([True, True, False, True, True])


def _interpreted(fn, *args, **kwargs):
    if jax.default_backend() == "tpu":
        return fn(*args, **kwargs)
    with pltpu.force_tpu_interpret_mode():
        return fn(*args, **kwargs)


def _pools(dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    shape = (LAYERS, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    return tuple(jnp.asarray(rng.normal(size=shape), dtype) for _ in range(2))


@pytest.mark.parametrize(("layer", "window", "softcap"), [(1, None, None), (2, 3, 5.0), (0, 6, None)])
def test_the_kernel_attends_over_the_blocks_the_table_names_as_the_gathered_path_does(
        layer: int, window: int | None, softcap: float | None) -> None:
    k_pool, v_pool = _pools(jnp.float32)
    q_rhd = jnp.asarray(np.random.default_rng(1).normal(size=(len(TABLE), HEADS, HEAD_DIM)), jnp.float32)
    got = np.asarray(_interpreted(paged_decode_attention, q_rhd, k_pool, v_pool, jnp.int32(layer), jnp.asarray(TABLE),
                                  jnp.asarray(POSITIONS), window, scale=SCALE, softcap=softcap))
    keys, values = gather_blocks(k_pool, layer, jnp.asarray(TABLE)), gather_blocks(v_pool, layer, jnp.asarray(TABLE))
    k_pos = np.broadcast_to(np.arange(keys.shape[1]), keys.shape[:2])
    expected = np.asarray(attention(q_rhd[:, None], keys, values, POSITIONS[:, None], k_pos, scale=SCALE,
                                    softcap=softcap, window=window)[:, 0])
    # float32 rounding of two matmuls and a softmax: a few units in the last place of the largest output; a wrong
    # block, position or mask is off by the outputs' own size.
    np.testing.assert_allclose(got[LIVE], expected[LIVE], rtol=0, atol=1e-6 * np.abs(expected).max())
    assert not np.any(got[~LIVE])  # a row with no block attends to nothing


def test_the_kernel_reads_the_copied_blocks_only_so_no_other_block_changes_its_output() -> None:
    k_pool, v_pool = _pools(jnp.float32)
    q_rhd = jnp.ones((len(TABLE), HEADS, HEAD_DIM), jnp.float32)
    args = (jnp.int32(1), jnp.asarray(TABLE), jnp.asarray(POSITIONS), None)
    before = _interpreted(paged_decode_attention, q_rhd, k_pool, v_pool, *args, scale=SCALE)
    # Row 0 sits at position 9 of blocks 3, 7, 1, 0 (block size 4): it reads blocks 3, 7 and 1, not 0, and
    # positions past 9 in block 1 are masked; block 0 poisoned with NaN must not reach any row.
    poisoned = v_pool.at[1, 0].set(jnp.nan), k_pool.at[1, 0].set(jnp.nan)
    after = _interpreted(paged_decode_attention, q_rhd, poisoned[1], poisoned[0], *args, scale=SCALE)
    np.testing.assert_array_equal(np.asarray(after), np.asarray(before))


def test_a_decode_step_through_the_kernel_gives_the_gathered_paths_states_and_cache(monkeypatch) -> None:
    cfg = dataclasses.replace(ModelConfig.tiny(), n_heads=16, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                              layer_types=("sliding", "full") * 2, sliding_window=5)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    cache = jax.tree.map(lambda c: c + 0.5, init_cache(cfg, 12, 4))
    table = jnp.asarray([[4, 0, 7, 12], [2, 6, 9, 3]], jnp.int32)
    prompt = jnp.asarray([[(11 * i) % 512 for i in range(9)], [(5 * i + 1) % 512 for i in range(9)]], jnp.int32)
    _, cache = nnx.jit(lambda m, c: m.hidden(prompt, jnp.broadcast_to(jnp.arange(9), (2, 9)), c, table))(model, cache)
    # One token per row at positions 9 and 9: the kernel where it may run (forced here: a CPU interprets it).
    monkeypatch.setattr(attention_module, "flash_unsupported", lambda *a, **k: None)
    step = nnx.jit(lambda m, c, kernel: m.hidden(jnp.asarray([[7], [8]]), jnp.asarray([[9], [9]]), c, table,
                                                  attention=kernel), static_argnums=2)
    h_xla, cache_xla = step(model, cache, "xla")
    h_kernel, cache_kernel = _interpreted(step, model, cache, "flash")
    np.testing.assert_allclose(np.asarray(h_kernel), np.asarray(h_xla), rtol=0, atol=1e-5)
    assert isinstance(cache_kernel, KVCache)
    for a, b in zip(cache_kernel, cache_xla, strict=True):  # later layers' keys follow earlier layers' rounding
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
    assert not np.allclose(np.asarray(cache_kernel.k_lnskd), np.asarray(cache.k_lnskd))  # the step wrote its keys


def test_the_decode_kernel_serves_sliding_layers_but_wants_kv_heads_in_eights_and_spans_that_fit() -> None:
    sliding8 = dataclasses.replace(ModelConfig.tiny(), n_heads=16, n_kv_heads=8, head_dim=128, dtype="bfloat16",
                                   layer_types=("sliding", "full") * 2, sliding_window=5)
    with pytest.raises(ValueError, match="2 kv heads, not a multiple of 8"):
        use_flash("flash", dataclasses.replace(sliding8, n_kv_heads=2), 64, decode=True)
    # Keys and values of two rows, 8 heads of 128 in bfloat16: 8 KiB a position, so 1,024 positions fill 8 MiB.
    with pytest.raises(ValueError, match="a span of 1040 positions needs 8.125 MiB of vector memory for its copies, "
                                         "over 8 MiB"):
        use_flash("flash", sliding8, 1040, decode=True)
    if jax.default_backend() == "tpu":
        assert use_flash("auto", sliding8, 1024, decode=True)
    else:  # neither the window nor a span that fits is a reason; the backend is
        assert not use_flash("auto", sliding8, 1024, decode=True)
        with pytest.raises(ValueError, match="TPU kernel and JAX's backend is 'cpu'"):
            use_flash("flash", sliding8, 1024, decode=True)
