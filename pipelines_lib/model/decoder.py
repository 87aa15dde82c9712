"""Flax NNX decoder-only transformer read from a ``ModelConfig`` (Llama 3, Qwen2/3, Gemma 2/3 text).

One attention implementation serves both uses:

* training / scoring: ``model(tokens_bt, positions_bt) -> logits_btv`` attends over the tokens it is
  given, causally by position (sequences are right-padded, so causal is enough); ``Decoder.final_hidden``
  is the same forward stopped before the unembedding, for losses that unembed a chunk at a time; on one TPU
  device its attention can run a Pallas flash kernel instead of XLA's (``ATTENTION_KERNELS``);
* inference: ``model.hidden(tokens_bt, positions_bt, cache, table_bn) -> (h_btd, cache)`` works on a
  paged ``KVCache`` (``kv_pool``): a pool of fixed-size blocks per layer (stacked over layers), shared by all
  sequences, and a block table per row saying which pool block holds its positions
  ``[j · block_size, (j + 1) · block_size)``.
  It first writes the new keys/values into their blocks, then gathers the row's ``n`` table blocks (``n``, the
  table's width, bounds the attention to ``n · block_size`` positions) and attends over them with the same
  causal-by-position mask; on one TPU device a decode step (one token per row) reads the blocks in place with a
  Pallas kernel instead (``paged_attention``). Gathered position ``s`` always holds position ``s``, so entries
  beyond a sequence's current position (stale keys of an earlier request in a reused block, padding of a
  prefill bucket, blocks not assigned yet) are masked out by causality alone and never need clearing. Writes to
  positions outside the table (or to the "no block" id ``num_blocks``) are dropped. ``model.unembed(h)``
  turns the hidden states the engine picks into float32 logits.

Layer ``i`` is: x += post_norm?(attn(attn_norm(x))); x += post_norm?(mlp(mlp_norm(x))), with rope on
q/k (optionally RMS-normalised per head first), grouped-query attention, optional sliding window and
score soft-cap, and a gated MLP (SwiGLU or GeGLU).

The layers are one ``Block`` whose parameters are stacked over a leading layer axis (the decoder's ``layers``;
parameter paths ``layers/attn/q_proj/kernel`` of shape ``[n_layers, ...]``), applied by ``jax.lax.scan``:
one layer body is traced and compiled however deep the model, so compile time does not grow with depth.
What differs between layers (Gemma's sliding vs global layers: the window, the rope frequencies) is
per-layer *data* scanned alongside the parameters (``LayerData``), not structure. The KV cache is stacked
the same way and carried through the scan, each layer writing its own slice in place. Under
differentiation the scan body can be rematerialised (``REMAT_POLICIES``): the reverse scan recomputes
one layer at a time, so at most one layer's activations are alive in the backward pass.

Every parameter names its axes (Flax NNX ``out_sharding`` metadata: ``layers``, ``embed``, ``vocab``,
``heads``, ``kv_heads``, ``head_dim``, ``mlp``); ``pipelines_lib/mesh.py``'s rules table maps the names onto a
device mesh (``layers`` onto none: each device holds its shards of every layer). The names are metadata only:
nothing is sharded when a decoder is built (``eager_sharding=False``), the stage places it on its mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pipelines_lib.model.attention import ATTENTION_RESIDUALS, attention, flash_causal_attention, use_flash
from pipelines_lib.model.config import ModelConfig, RopeScaling
from pipelines_lib.model.kv_pool import KVCache, gather_blocks, write_blocks
from pipelines_lib.model.paged_attention import paged_decode_attention


@functools.cache
def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies ``theta^(-2i/d)``, rescaled as transformers does for ``linear``/``llama3``."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv.astype(np.float32)
    if scaling.kind == "linear":
        inv = inv / scaling.factor
    else:  # llama3: long wavelengths scaled by 1/factor, short kept, a smooth blend in between
        old = scaling.original_max_position_embeddings
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / scaling.low_freq_factor, inv / scaling.factor, inv)
        smooth = (old / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= old / scaling.high_freq_factor) & (wavelen <= old / scaling.low_freq_factor)
        inv = np.where(medium, blended, scaled)
    return inv.astype(np.float32)


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate pairs (i, i + d/2) by ``position * inv_freq[i]`` (the "rotate_half" layout of HF)."""
    angles_btf = positions_bt[..., None].astype(jnp.float32) * inv_freq
    cos = jnp.cos(jnp.concatenate([angles_btf, angles_btf], -1))[:, :, None, :].astype(x_bthd.dtype)
    sin = jnp.sin(jnp.concatenate([angles_btf, angles_btf], -1))[:, :, None, :].astype(x_bthd.dtype)
    half = x_bthd.shape[-1] // 2
    rotated = jnp.concatenate([-x_bthd[..., half:], x_bthd[..., :half]], -1)
    return x_bthd * cos + rotated * sin


def unembed_logits(h_xd: jax.Array, w_vd: jax.Array, softcap: float | None) -> jax.Array:
    """Float32 logits ``[..., V]`` of hidden states ``[..., D]`` against unembedding rows ``w_vd`` (all of the
    vocabulary or a slice of it), soft-capped as ``softcap · tanh(z / softcap)`` when ``softcap`` is set."""
    # Accumulated and returned in float32 whatever the compute dtype: rounding logits to bfloat16
    # would be the largest error of a bfloat16 step (the loss and its gradient start here).
    logits = jnp.einsum("...d,vd->...v", h_xd, w_vd, preferred_element_type=jnp.float32)
    return logits if softcap is None else softcap * jnp.tanh(logits / softcap)


def _named(init: nnx.Initializer, *axes: str) -> nnx.Initializer:
    """``init`` whose parameter carries the logical axis names ``axes`` (see the module docstring)."""
    return nnx.with_partitioning(init, axes, eager_sharding=False)


def _linear(d_in: int, d_out: int, axes: tuple[str, str], *, use_bias: bool, dtype: jnp.dtype,
            rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=dtype, param_dtype=dtype, rngs=rngs,
                      kernel_init=_named(nnx.nn.linear.default_kernel_init, *axes),
                      bias_init=_named(nnx.nn.linear.default_bias_init, axes[1]))


class RMSNorm(nnx.Module):
    """``x / rms(x) * w`` (``rms``) or ``x / rms(x) * (1 + w)`` (``gemma_rms``), normalised in float32."""

    def __init__(self, dim: int, *, eps: float, variant: str, dtype: jnp.dtype, axis: str = "embed"):
        self.eps = eps
        self.plus_one = variant == "gemma_rms"
        self.scale = nnx.Param(jnp.zeros(dim, dtype) if self.plus_one else jnp.ones(dim, dtype),
                               out_sharding=(axis,), eager_sharding=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:
            return (y * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)
        return y.astype(x.dtype) * self.scale[...]


class LayerData(NamedTuple):
    """What distinguishes a layer besides its parameters; stacked over layers and scanned with them."""

    index: jax.Array
    """The layer's place in the stack: its slice of the KV cache."""
    inv_freq_f: jax.Array
    """Its rope inverse frequencies (Gemma 3's sliding layers have their own base, unscaled)."""
    window: jax.Array | None
    """Its sliding window (a full layer's is wider than any sequence); None when no layer slides, so a
    model without sliding layers computes no window mask at all."""


def layer_data(cfg: ModelConfig) -> LayerData:
    """``LayerData`` of every layer of ``cfg``, each field with a leading ``n_layers`` axis."""
    local = cfg.local_rope_theta is not None

    def inv_freq(kind: str) -> np.ndarray:
        if kind == "sliding" and local:
            return rope_inv_freq(cfg.head_dim, cfg.local_rope_theta, None)
        return rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    kinds = cfg.layer_kinds
    window = None
    if "sliding" in kinds:
        unbounded = np.iinfo(np.int32).max  # q_pos - k_pos is always below it: a full layer
        window = np.asarray([cfg.sliding_window if k == "sliding" else unbounded for k in kinds], np.int32)
    return LayerData(np.arange(cfg.n_layers, dtype=np.int32), np.stack([inv_freq(k) for k in kinds]), window)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        lin = {"dtype": dtype, "rngs": rngs}
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # Head-major flattened projections: splitting ``heads`` evenly keeps whole heads on each device.
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.q_proj = _linear(cfg.d_model, q, ("embed", "heads"), use_bias=cfg.qkv_bias, **lin)
        self.k_proj = _linear(cfg.d_model, kv, ("embed", "kv_heads"), use_bias=cfg.qkv_bias, **lin)
        self.v_proj = _linear(cfg.d_model, kv, ("embed", "kv_heads"), use_bias=cfg.qkv_bias, **lin)
        self.o_proj = _linear(q, cfg.d_model, ("heads", "embed"), use_bias=False, **lin)
        if cfg.qk_norm:
            norm = {"eps": cfg.norm_eps, "variant": cfg.norm, "dtype": dtype, "axis": "head_dim"}
            self.q_norm = RMSNorm(cfg.head_dim, **norm)
            self.k_norm = RMSNorm(cfg.head_dim, **norm)
        self.qk_norm = cfg.qk_norm
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_logit_softcap

    def __call__(
        self, x_btd: jax.Array, positions_bt: jax.Array, layer: LayerData, cache: KVCache | None,
        table_bn: jax.Array | None, flash: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        b, t, _ = x_btd.shape
        q = self.q_proj(x_btd).reshape(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x_btd).reshape(b, t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x_btd).reshape(b, t, self.n_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, positions_bt, layer.inv_freq_f)
        k = apply_rope(k, positions_bt, layer.inv_freq_f)
        if flash and cache is None:
            o = flash_causal_attention(q, k, v, scale=self.scale, softcap=self.softcap)
            return self.o_proj(o.reshape(b, t, -1)), cache
        if cache is None:
            keys, values, k_pos_bs = k, v, positions_bt
        else:
            assert table_bn is not None
            cache = KVCache(write_blocks(cache.k_lnskd, layer.index, k, positions_bt, table_bn),
                            write_blocks(cache.v_lnskd, layer.index, v, positions_bt, table_bn))
            if flash:  # one query per row: the kernel reads the blocks in place
                o = paged_decode_attention(q[:, 0], cache.k_lnskd, cache.v_lnskd, layer.index, table_bn,
                                           positions_bt[:, 0], layer.window, scale=self.scale, softcap=self.softcap)
                return self.o_proj(o.reshape(b, t, -1)), cache
            keys = gather_blocks(cache.k_lnskd, layer.index, table_bn)
            values = gather_blocks(cache.v_lnskd, layer.index, table_bn)
            k_pos_bs = jnp.broadcast_to(jnp.arange(keys.shape[1]), (b, keys.shape[1]))
        o = attention(
            q,
            keys,
            values,
            positions_bt,
            k_pos_bs,
            scale=self.scale,
            softcap=self.softcap,
            window=layer.window,
        )
        return self.o_proj(o.reshape(b, t, -1)), cache


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        lin = {"use_bias": False, "dtype": dtype, "rngs": rngs}
        self.gate_proj = _linear(cfg.d_model, cfg.d_ff, ("embed", "mlp"), **lin)
        self.up_proj = _linear(cfg.d_model, cfg.d_ff, ("embed", "mlp"), **lin)
        self.down_proj = _linear(cfg.d_ff, cfg.d_model, ("mlp", "embed"), **lin)
        self.activation = cfg.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = self.gate_proj(x)
        gate = jax.nn.silu(gate) if self.activation == "silu" else jax.nn.gelu(gate, approximate=True)
        return self.down_proj(gate * self.up_proj(x))


class Block(nnx.Module):
    """One decoder layer; ``Decoder.layers`` is a ``Block`` whose parameters carry a leading layer axis."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        norm = {"eps": cfg.norm_eps, "variant": cfg.norm, "dtype": jnp.dtype(cfg.dtype)}
        self.attn_norm = RMSNorm(cfg.d_model, **norm)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, **norm)
        self.mlp = MLP(cfg, rngs=rngs)
        self.post_norms = cfg.post_norms
        if cfg.post_norms:
            self.attn_post_norm = RMSNorm(cfg.d_model, **norm)
            self.mlp_post_norm = RMSNorm(cfg.d_model, **norm)

    def __call__(
        self,
        x_btd: jax.Array,
        positions_bt: jax.Array,
        layer: LayerData,
        cache: KVCache | None = None,
        table_bn: jax.Array | None = None,
        flash: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        a, cache = self.attn(self.attn_norm(x_btd), positions_bt, layer, cache, table_bn, flash)
        if self.post_norms:
            a = self.attn_post_norm(a)
        x_btd = x_btd + a
        m = self.mlp(self.mlp_norm(x_btd))
        if self.post_norms:
            m = self.mlp_post_norm(m)
        return x_btd + m, cache


def stacked_blocks(cfg: ModelConfig, rngs: nnx.Rngs) -> Block:
    """``cfg.n_layers`` independently initialised layers as one ``Block`` of stacked parameters (leading axis
    named ``layers``), built by one vectorised initialisation rather than a Python loop of layers."""

    @nnx.split_rngs(splits=cfg.n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(cfg, rngs=rngs)

    return make(rngs)


REMAT_POLICIES: Mapping[str, Callable[..., bool] | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "attention": jax.checkpoint_policies.save_only_these_names(ATTENTION_RESIDUALS),
}
"""What the backward pass keeps of each layer's forward (gradient checkpointing of the layer scan's body).

``none``: everything (no recomputation; activation memory grows with depth × tokens). ``full``: only each
layer's input; the backward pass recomputes the whole layer, one layer at a time (about one more forward
pass). ``dots``: also the outputs of the weight matmuls (projections and MLP, not the attention scores):
the backward pass recomputes only norms, rope, attention and activations, for several token × width buffers
per layer more memory than ``full``. ``attention``: ``full``, but where the flash kernel runs, also its output and
softmax statistics (``ATTENTION_RESIDUALS``), so the backward pass recomputes the layer but not its attention,
for one token × width buffer per layer more (with XLA's attention it keeps what ``full`` keeps). The values are
the same under every policy."""


def _scanned(body: Callable[[Any, Any], Any], remat: str) -> Callable[[Any, Any], Any]:
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)}, got {remat!r}")
    policy = REMAT_POLICIES[remat]
    # prevent_cse is for checkpoints outside a loop; inside a scan body it only blocks optimisations.
    return body if policy is None else jax.checkpoint(body, policy=policy, prevent_cse=False)


class Decoder(nnx.Module):
    """Decoder-only transformer; see the module docstring for the two entry points."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = jnp.dtype(cfg.dtype)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs,
                               embedding_init=_named(nnx.nn.linear.default_embed_init, "vocab", "embed"))
        self.layers = stacked_blocks(cfg, rngs)
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, variant=cfg.norm, dtype=dtype)
        if not cfg.tie_embeddings:
            self.lm_head = _linear(cfg.d_model, cfg.vocab_size, ("embed", "vocab"), use_bias=False, dtype=dtype,
                                   rngs=rngs)

    def __call__(
        self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None, *, remat: str = "none",
        attention: str = "auto",
    ) -> jax.Array:
        """Causal logits_btv (float32) over the given tokens, no cache: ``unembed(final_hidden(...))``."""
        return self.unembed(self.final_hidden(tokens_bt, positions_bt, remat=remat, attention=attention))

    def final_hidden(
        self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None, *, remat: str = "none",
        attention: str = "auto",
    ) -> jax.Array:
        """Final-norm hidden states h_btd over the given tokens, no cache: the forward up to the unembedding.

        Training scores tokens from these rather than from ``logits_btv``, unembedding a chunk of tokens at a
        time (``train.losses.token_logp_and_entropy``): at a 152k vocabulary the full logits, their
        log-softmax and their gradient are each 0.6 GiB per 1k tokens in float32.

        ``remat``: what the backward pass keeps of each layer (a ``REMAT_POLICIES`` name); the values are
        the same under every policy. ``attention``: an ``ATTENTION_KERNELS`` name. The flash kernel masks by
        index, not position, so where it runs each row must hold positions ``0 .. T-1`` (as ``TrainBatch`` rows
        do; rope still reads ``positions_bt``); pass ``xla`` for rows that start elsewhere."""
        if positions_bt is None:
            positions_bt = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1]), tokens_bt.shape)
        flash = use_flash(attention, self.cfg, tokens_bt.shape[1])
        graphdef, params = nnx.split(self.layers)

        def body(x_btd: jax.Array, xs: tuple[nnx.State, LayerData]) -> tuple[jax.Array, None]:
            params_l, layer = xs
            return nnx.merge(graphdef, params_l)(x_btd, positions_bt, layer, flash=flash)[0], None

        x, _ = jax.lax.scan(_scanned(body, remat), self._embed(tokens_bt), (params, layer_data(self.cfg)))
        return self.final_norm(x)

    def hidden(
        self, tokens_bt: jax.Array, positions_bt: jax.Array, cache: KVCache, table_bn: jax.Array, *,
        attention: str = "auto",
    ) -> tuple[jax.Array, KVCache]:
        """Final-norm hidden states of the new tokens, and the cache with their keys/values written into
        the blocks ``table_bn`` names (see the module docstring). ``attention``: an ``ATTENTION_KERNELS`` name;
        where the kernel runs, a decode step (one token per row) reads the blocks in place
        (``paged_attention``) instead of gathering them; longer chunks always gather. A chunk's positions are
        consecutive in each row (``write_blocks`` writes it through whole blocks)."""
        graphdef, params = nnx.split(self.layers)
        span_positions = table_bn.shape[1] * cache.k_lnskd.shape[2]
        flash = tokens_bt.shape[1] == 1 and use_flash(attention, self.cfg, span_positions, decode=True)

        def body(carry: tuple[jax.Array, KVCache], xs: tuple[nnx.State, LayerData]
                 ) -> tuple[tuple[jax.Array, KVCache], None]:
            params_l, layer = xs
            return nnx.merge(graphdef, params_l)(carry[0], positions_bt, layer, carry[1], table_bn, flash), None

        (x, cache), _ = jax.lax.scan(body, (self._embed(tokens_bt), cache), (params, layer_data(self.cfg)))
        return self.final_norm(x), cache

    def unembed(self, h_btd: jax.Array) -> jax.Array:
        """Float32 logits of final-norm hidden states (with the final soft-cap if configured)."""
        return unembed_logits(h_btd, self.unembedding_vd(), self.cfg.final_logit_softcap)

    def unembedding_vd(self) -> jax.Array:
        """The unembedding matrix, one row per vocabulary entry: the embedding when tied, else ``lm_head``'s
        kernel transposed (a transpose XLA folds into the matmul of ``unembed_logits``)."""
        return self.embed.embedding[...] if self.cfg.tie_embeddings else self.lm_head.kernel[...].T

    def _embed(self, tokens_bt: jax.Array) -> jax.Array:
        x = self.embed(tokens_bt)
        if self.cfg.embed_scale:
            # The scale is rounded to the parameter dtype, as in Gemma's reference code.
            x = x * jnp.asarray(self.cfg.d_model**0.5, x.dtype)
        return x


def with_dtype(model: Decoder, dtype: str) -> Decoder:
    """``model`` computing in ``dtype``: the same structure built for ``dtype``, parameters cast into it.

    Differentiable (the cast is part of the graph), so a loss of the copy has gradients in the original
    dtype: the mixed-precision forward of ``train.step``. Also the compute-dtype copy the trainer
    publishes. Returns ``model`` itself when it already is in ``dtype``.
    """
    if model.cfg.dtype == dtype:
        return model
    cfg = dataclasses.replace(model.cfg, dtype=dtype)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    params = jax.tree.map(lambda p: p.astype(dtype), nnx.state(model, nnx.Param))
    return nnx.merge(graphdef, params)
