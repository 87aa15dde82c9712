"""ModelConfig validation and round-trips, the decoder's cached path against its plain forward, and
Orbax weight folders."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from pipelines_lib.engine.device import DecodeRows, steps_for
from pipelines_lib.model.attention import attention, flash_causal_attention, use_flash
from pipelines_lib.model.config import ModelConfig, RopeScaling, param_count
from pipelines_lib.model.decoder import REMAT_POLICIES, Decoder, LayerData, rope_inv_freq
from pipelines_lib.model.kv_pool import KVCache, init_cache, write_blocks
from pipelines_lib.model.weights import load_weights, save_weights

TINY = ModelConfig.tiny()


@nnx.jit
def forward(model: Decoder, tokens_bt: jax.Array) -> jax.Array:
    return model(tokens_bt)


@nnx.jit
def cached_hidden(model: Decoder, tokens_bt: jax.Array, positions_bt: jax.Array, cache: KVCache, table_bn):
    return model.hidden(tokens_bt, positions_bt, cache, table_bn)


@pytest.fixture(scope="module")
def model() -> Decoder:
    return Decoder(TINY, rngs=nnx.Rngs(0))


def test_config_names_bad_values() -> None:
    base = TINY.to_dict()
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        ModelConfig.from_dict({**base, "n_kv_heads": 3})
    with pytest.raises(ValueError, match="norm must be one of .*'layer'"):
        ModelConfig.from_dict({**base, "norm": "layer"})
    with pytest.raises(ValueError, match="activation .*'relu'"):
        ModelConfig.from_dict({**base, "activation": "relu"})
    with pytest.raises(ValueError, match="layer_types has 2 entries for n_layers=4"):
        ModelConfig.from_dict({**base, "layer_types": ["full", "sliding"]})
    with pytest.raises(ValueError, match="sliding_window must be >= 1 with sliding layers, got None"):
        ModelConfig.from_dict({**base, "layer_types": ["full", "sliding"] * 2})
    with pytest.raises(ValueError, match="unknown keys \\['n_experts'\\]"):
        ModelConfig.from_dict({**base, "n_experts": 8})
    with pytest.raises(ValueError, match="RopeScaling.kind .*'yarn'"):
        RopeScaling(kind="yarn", factor=2.0)


def test_config_json_round_trip_is_exact() -> None:
    cfg = ModelConfig.from_dict(
        {
            **TINY.to_dict(),
            "rope_scaling": {"kind": "llama3", "factor": 8.0, "original_max_position_embeddings": 64},
            "layer_types": ["sliding", "full"] * 2,
            "sliding_window": 8,
            "attn_logit_softcap": 50.0,
        }
    )
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert ModelConfig.from_dict(json.loads(json.dumps(TINY.to_dict()))) == TINY


def test_tiny_is_small_and_param_count_matches(model: Decoder) -> None:
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert sum(x.size for x in leaves) == param_count(TINY) == 853_120  # 4·(98304+49152+256)+65536+128


def test_forward_is_causal_and_float32(model: Decoder) -> None:
    tokens = jnp.asarray([[5, 6, 7, 8, 9, 10]], jnp.int32)
    changed_tail = tokens.at[0, 4:].set(0)
    logits, logits_changed = forward(model, tokens), forward(model, changed_tail)
    assert logits.shape == (1, 6, 512) and logits.dtype == jnp.float32
    np.testing.assert_array_equal(logits[0, :4], logits_changed[0, :4])
    assert not np.allclose(logits[0, 4:], logits_changed[0, 4:])


def test_chunked_paged_cache_path_equals_plain_forward(model: Decoder) -> None:
    tokens = jnp.asarray(
        [[(11 * i) % 512 for i in range(20)], [(5 * i + 1) % 512 for i in range(20)]], jnp.int32
    )
    expected = np.asarray(forward(model, tokens))
    # Blocks of 8 positions, scattered over a pool of 9 with stale values in it; row 1's third block
    # is not assigned until it is needed (9 = "no block": its writes are dropped, its reads masked).
    cache = jax.tree.map(lambda c: c + 5.0, init_cache(TINY, 9, 8))
    table = np.asarray([[4, 0, 7, 9], [2, 6, 9, 9]], np.int32)
    positions = jnp.broadcast_to(jnp.arange(20), (2, 20))
    h_first, cache = cached_hidden(model, tokens[:, :13], positions[:, :13], cache, table)  # prefill
    table[1, 2] = 3
    steps = [h_first]
    for t in range(13, 20):  # then one token at a time, attending over three blocks only
        h, cache = cached_hidden(model, tokens[:, t : t + 1], positions[:, t : t + 1], cache, table[:, :3])
        steps.append(h)
    got = np.asarray(nnx.jit(lambda m, h: m.unembed(h))(model, jnp.concatenate(steps, axis=1)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_a_chunk_writes_exactly_the_positions_a_token_by_token_write_would() -> None:
    """Blocks of 4 in a pool of 10 (10 = "no block"), one layer of two written, chunks of 6. Row 0: positions 7-12,
    from the last offset of its second block over three blocks; row 1: 0-5 from a block start, its second block
    unassigned (dropped); row 2: 13-18, past its table's four blocks from 16 on (dropped); row 3: padding (no
    block). Everything else keeps its stale value."""
    rng = np.random.default_rng(0)
    pool = jnp.asarray(rng.normal(size=(2, 10, 4, 2, 3)), jnp.float32)
    table = jnp.asarray([[5, 2, 8, 0], [7, 10, 10, 10], [1, 3, 4, 6], [10, 10, 10, 10]], jnp.int32)
    positions = jnp.asarray([7, 0, 13, 0], jnp.int32)[:, None] + jnp.arange(6)
    new = jnp.asarray(rng.normal(size=(4, 6, 2, 3)), jnp.float32)
    chunked = np.asarray(jax.jit(write_blocks)(pool, jnp.int32(1), new, positions, table))
    expected = np.asarray(pool).copy()
    for b, row in enumerate(np.asarray(positions)):
        for t, p in enumerate(row):
            if p // 4 < 4 and (block := int(table[b, p // 4])) < 10:
                expected[1, block, p % 4] = np.asarray(new[b, t])
    np.testing.assert_array_equal(chunked, expected)
    token_by_token = pool
    for t in range(6):
        token_by_token = write_blocks(token_by_token, jnp.int32(1), new[:, t:t + 1], positions[:, t:t + 1], table)
    np.testing.assert_array_equal(np.asarray(token_by_token), expected)


def test_sliding_window_attention_equals_attention_over_the_window_only() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 9, h, 8)), jnp.float32) for h in (4, 2, 2))
    pos = jnp.arange(9)[None]
    attend = jax.jit(attention, static_argnames=("scale", "softcap", "window"))
    windowed = attend(q, k, v, pos, pos, scale=0.3, softcap=None, window=3)
    # The last query sees keys 6, 7, 8 only.
    last = attend(q[:, 8:], k[:, 6:], v[:, 6:], pos[:, 8:], pos[:, 6:], scale=0.3, softcap=None, window=None)
    np.testing.assert_allclose(windowed[:, 8:], last, rtol=0, atol=1e-6)


def test_llama3_rope_scaling_keeps_short_and_scales_long_wavelengths() -> None:
    scaling = RopeScaling(kind="llama3", factor=8.0, original_max_position_embeddings=64)
    plain, scaled = rope_inv_freq(8, 10000.0, None), rope_inv_freq(8, 10000.0, scaling)
    # inverse frequencies 1, 0.1, 0.01, 0.001: wavelengths 6.3 (< 64/4: kept), 63 (blended), 628 and 6283
    # (> 64/1: divided by 8). Blend at 63: smooth = (64/62.8 - 1)/3 = 0.0063.
    np.testing.assert_allclose(scaled[[0, 2, 3]], [1.0, 0.01 / 8, 0.001 / 8], rtol=1e-6)
    smooth = (64 / (2 * np.pi / 0.1) - 1) / 3
    np.testing.assert_allclose(scaled[1], (1 - smooth) * 0.1 / 8 + smooth * 0.1, rtol=1e-6)
    np.testing.assert_allclose(plain, [1.0, 0.1, 0.01, 0.001], rtol=1e-6)


def test_weights_round_trip_through_orbax(model: Decoder, tmp_path) -> None:
    save_weights(model, str(tmp_path / "w"))
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["model_config.json", "state"]
    restored = load_weights(f"file://{tmp_path / 'w'}")
    assert restored.cfg == model.cfg
    tokens = jnp.asarray([[1, 2, 3]], jnp.int32)
    np.testing.assert_array_equal(forward(restored, tokens), forward(model, tokens))
    with pytest.raises(ValueError, match="already exists"):
        save_weights(model, str(tmp_path / "w"))
    with pytest.raises(FileNotFoundError, match="no model config"):
        load_weights(str(tmp_path))


def test_bfloat16_model_tracks_float32(model: Decoder) -> None:
    bf16_cfg = ModelConfig.from_dict({**TINY.to_dict(), "dtype": "bfloat16"})
    bf16 = nnx.eval_shape(lambda: Decoder(bf16_cfg, rngs=nnx.Rngs(0)))
    nnx.update(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    tokens = jnp.asarray([[3, 1, 4, 1, 5, 9, 2, 6]], jnp.int32)
    low, high = forward(bf16, tokens), forward(model, tokens)
    assert low.dtype == jnp.float32 and bf16.embed.embedding[...].dtype == jnp.bfloat16
    # bf16 keeps ~3 significant digits; the logits are O(1).
    np.testing.assert_allclose(low, high, rtol=0, atol=0.1)


def test_weights_saved_with_unrolled_layers_load_stacked_and_give_the_logits_they_gave() -> None:
    # A weights folder written when each layer was its own subtree (``layers/0/...``), with the logits that
    # model computed for these tokens (a sliding and a full layer, qk-norm).
    folder = Path(__file__).parent / "fixtures" / "unrolled_weights"
    model = load_weights(str(folder))
    assert model.layers.attn.q_proj.kernel.shape == (2, 16, 16)
    tokens = jnp.asarray([[1, 5, 9, 13, 17, 21, 25, 29]], jnp.int32)
    np.testing.assert_allclose(forward(model, tokens), np.load(folder / "logits.npy"), rtol=0, atol=1e-5)


def test_scanned_layers_equal_the_layers_rolled_by_hand_with_their_own_window_and_rope() -> None:
    # Gemma-3-like: sliding layers with their own rope base and window 3, full layers with a scaled global rope.
    cfg = ModelConfig.from_dict({
        **TINY.to_dict(), "layer_types": ["sliding", "full", "sliding", "full"], "sliding_window": 3,
        "local_rope_theta": 50.0, "rope_scaling": {"kind": "linear", "factor": 4.0}, "qk_norm": True,
        "post_norms": True, "norm": "gemma_rms", "activation": "gelu_tanh", "embed_scale": True})
    model = Decoder(cfg, rngs=nnx.Rngs(1))
    tokens = jnp.asarray([[(7 * i + 3) % 512 for i in range(10)]], jnp.int32)
    positions = jnp.arange(10)[None]

    @jax.jit
    def by_hand(params: nnx.State) -> jax.Array:
        m = nnx.merge(nnx.graphdef(model), params)
        graphdef, stacked = nnx.split(m.layers)
        x = m._embed(tokens)
        for i, kind in enumerate(cfg.layer_kinds):
            block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], stacked))
            if kind == "sliding":
                layer = LayerData(jnp.int32(i), rope_inv_freq(cfg.head_dim, 50.0, None), jnp.int32(3))
            else:
                layer = LayerData(jnp.int32(i), rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), None)
            x = block(x, positions, layer)[0]
        return m.unembed(m.final_norm(x))

    expected = by_hand(nnx.state(model))
    np.testing.assert_allclose(forward(model, tokens), expected, rtol=0, atol=1e-5)
    # The per-layer data matters: the same parameters read as all-full layers give other logits.
    all_full = dataclasses.replace(cfg, layer_types=(), sliding_window=None, local_rope_theta=None)
    assert not np.allclose(forward(nnx.merge(nnx.graphdef(Decoder(all_full, rngs=nnx.Rngs(1))), nnx.state(model)),
                                   tokens), expected, atol=1e-3)


def test_the_lowered_decode_step_holds_one_layer_body_however_many_layers() -> None:
    def dots(n_layers: int) -> int:
        cfg = dataclasses.replace(TINY, n_layers=n_layers)
        graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
        rows, slots = 4, 8
        inputs = DecodeRows(slots, 32, 2).take(np.arange(rows), 2)
        text = steps_for(graphdef, 2).decode.lower(
            nnx.to_pure_dict(params), jax.eval_shape(lambda: init_cache(cfg, 16, 8)), np.zeros((rows, 4), np.int32),
            np.zeros(slots, np.int32), np.ones(slots, bool), inputs).as_text()
        return text.count("dot_general")

    two = dots(2)
    assert two > 0 and dots(4) == two


def test_attention_auto_runs_xla_where_flash_cannot_and_flash_says_why() -> None:
    sliding = dataclasses.replace(TINY, layer_types=("sliding", "full") * 2, sliding_window=64)
    assert not use_flash("auto", TINY, 100) and not use_flash("xla", TINY, 256)
    with pytest.raises(ValueError, match="not a multiple of 128"):
        use_flash("flash", TINY, 100)
    with pytest.raises(ValueError, match="sliding-window layers"):
        use_flash("flash", sliding, 256)
    if jax.default_backend() == "cpu":
        assert not use_flash("auto", TINY, 256)
        with pytest.raises(ValueError, match="TPU kernel and JAX's backend is 'cpu'"):
            use_flash("flash", TINY, 256)
    with pytest.raises(ValueError, match=r"attention must be one of \['auto', 'xla', 'flash'\], got 'pallas'"):
        use_flash("pallas", TINY, 256)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_the_flash_kernel_computes_causal_grouped_query_attention_and_its_gradients(softcap: float | None) -> None:
    """The Pallas kernel (run as Python, ``interpret``, on a CPU; compiled on a TPU) against ``attention``: 4 query
    heads over 2 key heads, 384 positions in three blocks of 128 (the blocks above the diagonal skipped, the diagonal
    ones masked inside), with and without a score soft-cap; values and the gradients of every input agree to float32
    rounding."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 384, h, 128)), jnp.float32) for h in (4, 2, 2))
    pos = jnp.broadcast_to(jnp.arange(384), (2, 384))

    def loss(fn: Callable[..., jax.Array], q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(fn(q, k, v)))  # weights every output differently

    xla = functools.partial(attention, q_pos_bt=pos, k_pos_bs=pos, scale=0.2, softcap=softcap, window=None)
    kernel = functools.partial(flash_causal_attention, scale=0.2, softcap=softcap,
                               interpret=jax.default_backend() != "tpu")
    np.testing.assert_allclose(kernel(q, k, v), xla(q, k, v), rtol=0, atol=2e-5)
    grads = [jax.grad(functools.partial(loss, fn), argnums=(0, 1, 2))(q, k, v) for fn in (kernel, xla)]
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * float(jnp.max(jnp.abs(want))))


def test_the_flash_kernel_of_one_shape_serves_every_program_that_traces_it() -> None:
    # The kernel is built once per shape, the first time a program being traced asks for it (a shape no other
    # test uses, so that is this test's first program); the second program, another trace of the same shape (a
    # train step under another remat policy, the reference model's scoring), used to find the first trace's
    # tracers in the kernel's block masks.
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.normal(size=(1, 384, h, 64)), jnp.float32) for h in (3, 1))
    first = jax.jit(lambda q, k: flash_causal_attention(q, k, k, scale=0.1, interpret=True))(q, k)
    second = jax.jit(lambda q, k: 2 * flash_causal_attention(q, k, k, scale=0.1, interpret=True))(q, k)
    np.testing.assert_allclose(second, 2 * first, rtol=1e-6)


def test_the_attention_remat_policy_keeps_the_flash_kernels_residuals_for_the_backward(capsys) -> None:
    """Under ``full`` a layer keeps only its inputs, so the backward pass reruns the flash kernel's forward; under
    ``attention`` it also keeps the kernel's output (heads-first) and softmax statistics, which the kernel's
    backward reads instead."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 128, h, 128)), jnp.float32) for h in (2, 1, 1))

    def layer(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(flash_causal_attention(jnp.tanh(q), k, v, scale=0.2, interpret=True)))

    def kept(policy: str) -> list[str]:  # what JAX's residual report lists beyond the inputs and constants
        print_saved_residuals(jax.checkpoint(layer, policy=REMAT_POLICIES[policy]), q, k, v)
        lines = capsys.readouterr().out.splitlines()
        return sorted(line.split()[0] for line in lines if "from the argument" not in line and "constant" not in line)

    assert kept("full") == []
    assert kept("attention") == ["f32[1,2,128,128]", "f32[1,2,128]"]
