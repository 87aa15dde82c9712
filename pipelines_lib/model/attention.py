"""Attention over keys at known positions: XLA's, and a Pallas flash kernel for training on a TPU.

``attention`` is the one definition (causal by position, optional sliding window and score soft-cap, grouped-query
heads) that the decoder's training forward and its paged inference path both use. ``flash_causal_attention``
computes the same function for rows at positions ``0 .. T-1`` with JAX's Pallas splash-attention kernel (flash
attention that skips the blocks causality masks out and reads grouped-query key heads in place), the scores kept
blockwise on the chip; ``use_flash`` decides, from ``ATTENTION_KERNELS``' names, where the decoder's training
forward runs it, and where its decode step runs the paged decode kernel (``paged_attention``) instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.paged_attention import MAX_COPY_BYTES, copy_bytes


def attention(
    q_bthd: jax.Array,
    k_bskd: jax.Array,
    v_bskd: jax.Array,
    q_pos_bt: jax.Array,
    k_pos_bs: jax.Array,
    *,
    scale: float,
    softcap: float | None,
    window: int | jax.Array | None,
) -> jax.Array:
    """softmax(mask(cap(scale · q kᵀ))) v with grouped-query heads.

    Key ``s`` is visible to query ``t`` iff ``k_pos <= q_pos`` (causal) and, unless ``window`` is None,
    ``q_pos - k_pos < window`` (a scalar array in the layer scan). Scores and softmax run in float32.
    """
    b, t, h, d = q_bthd.shape
    kv_heads = k_bskd.shape[2]
    q_btkgd = q_bthd.reshape(b, t, kv_heads, h // kv_heads, d)
    s_bkgts = jnp.einsum("btkgd,bskd->bkgts", q_btkgd, k_bskd, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        s_bkgts = softcap * jnp.tanh(s_bkgts / softcap)
    visible_bts = k_pos_bs[:, None, :] <= q_pos_bt[:, :, None]
    if window is not None:
        visible_bts &= q_pos_bt[:, :, None] - k_pos_bs[:, None, :] < window
    s_bkgts = jnp.where(visible_bts[:, None, None], s_bkgts, jnp.finfo(jnp.float32).min)
    p_bkgts = jax.nn.softmax(s_bkgts, axis=-1).astype(v_bskd.dtype)
    o_btkgd = jnp.einsum("bkgts,bskd->btkgd", p_bkgts, v_bskd)
    return o_btkgd.reshape(b, t, h, d)


ATTENTION_KERNELS = ("auto", "xla", "flash")
"""How training and scoring compute attention (``final_hidden``'s ``attention``). ``xla``: ``attention`` above,
the scores of every query against every key materialised in float32. ``flash``: the Pallas TPU splash-attention
kernel (blockwise, scores never leave the chip's vector memory), for models without sliding layers, on one TPU
device, with sequence lengths a multiple of 128; in a decode step over the paged cache (``Decoder.hidden``, one token
per row), the paged decode kernel (``paged_attention``: the blocks read in place, not gathered), on one TPU device,
sliding layers included, for models whose kv heads are a multiple of 8 and spans whose copies fit
``paged_attention.MAX_COPY_BYTES``. ``auto``: ``flash`` where it applies, else ``xla``. Both compute the same
function; they differ by rounding (bfloat16 inputs, float32 accumulation)."""


def flash_unsupported(cfg: ModelConfig, seq_len: int, *, decode: bool = False) -> str | None:
    """Why the flash kernel cannot serve ``cfg`` at ``seq_len`` tokens here (``decode``: why the paged decode kernel
    cannot attend over a span of ``seq_len`` positions), or None when it can."""
    if not decode and "sliding" in cfg.layer_kinds:
        return "the model has sliding-window layers"
    if not decode and seq_len % 128:
        return f"the sequence length {seq_len} is not a multiple of 128"
    if decode and cfg.n_kv_heads % 8:
        # The kernel reads a block [positions, kv heads, head dim] as a [positions · kv heads, head dim] matrix: the
        # same memory only when a position's kv heads fill the rows of the chip's (8, 128) tiles.
        return f"the model has {cfg.n_kv_heads} kv heads, not a multiple of 8"
    if decode and (need := copy_bytes(seq_len, cfg.n_kv_heads, cfg.head_dim, cfg.dtype)) > MAX_COPY_BYTES:
        return (f"a span of {seq_len} positions needs {need / 2**20:g} MiB of vector memory for its copies, over "
                f"{MAX_COPY_BYTES / 2**20:g} MiB")
    if jax.default_backend() != "tpu":
        return f"it is a TPU kernel and JAX's backend is {jax.default_backend()!r}"
    if jax.device_count() > 1:
        # A Pallas call is not partitioned by the compiler: on a mesh it would run replicated.
        return f"it runs on one device and JAX sees {jax.device_count()}"
    return None


def use_flash(kernel: str, cfg: ModelConfig, seq_len: int, *, decode: bool = False) -> bool:
    """Whether ``final_hidden`` runs the flash kernel (``decode``: ``hidden``'s decode step runs the paged decode
    kernel) for ``kernel`` (an ``ATTENTION_KERNELS`` name); ``flash`` where it cannot serve is a ``ValueError``
    saying why."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {list(ATTENTION_KERNELS)}, got {kernel!r}")
    if kernel == "xla":
        return False
    reason = flash_unsupported(cfg, seq_len, decode=decode)
    if kernel == "flash" and reason is not None:
        raise ValueError(f"attention 'flash' cannot run here: {reason}; use 'auto' or 'xla'")
    return reason is None


ATTENTION_RESIDUALS = "attention_residuals"
"""The checkpoint name of what the flash kernel's backward needs from its forward (its output and softmax
statistics): a remat policy that saves it (``REMAT_POLICIES["attention"]``) spares the backward pass a second run of
the kernel's forward."""


@functools.cache
def _splash_kernel(seq_len: int, heads: int, softcap: float | None, interpret: bool) -> splash.SplashAttentionKernel:
    """The causal kernel for one row of ``heads`` query heads over ``seq_len`` positions (built once per shape: its
    block masks are worked out on the host)."""
    # Blocks of 512 with the fused backward kernel measured fastest for a 0.6 B model at 8 x 1024 on a v5e, and
    # beat the flash kernel before it, which repeated the key heads (docs/TPU_PERF.md).
    block = next(b for b in (512, 256, 128) if seq_len % b == 0)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, use_fused_bwd_kernel=True)
    mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((seq_len, seq_len)) for _ in range(heads)])
    # Built outside any trace: the kernel keeps its block-mask arrays, and arrays made while the first program that
    # asks for it is traced would be that trace's tracers, leaked into every later program of the same shape.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                      attn_logits_soft_cap=softcap, residual_checkpoint_name=ATTENTION_RESIDUALS,
                                      interpret=interpret)


def flash_causal_attention(q_bthd: jax.Array, k_btkd: jax.Array, v_btkd: jax.Array, *, scale: float,
                           softcap: float | None = None, interpret: bool = False) -> jax.Array:
    """``attention`` for queries and keys at positions ``0 .. T-1`` of each row (causal by index), by the Pallas
    splash kernel, one row at a time (``vmap``). The kernel takes no score scale, so the queries are scaled first
    (in float32, rounded back to their dtype). ``interpret`` runs the kernel's Python body instead of compiling it
    (any backend; slow): how the CPU tests check it."""
    t, h = q_bthd.shape[1:3]
    kernel = _splash_kernel(t, h, softcap, interpret)
    q_bhtd = (q_bthd.astype(jnp.float32) * scale).astype(q_bthd.dtype).transpose(0, 2, 1, 3)
    o_bhtd = jax.vmap(kernel)(q_bhtd, k_btkd.transpose(0, 2, 1, 3), v_btkd.transpose(0, 2, 1, 3))
    return o_bhtd.transpose(0, 2, 1, 3)
