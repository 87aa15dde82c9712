"""Attention over keys at known positions: XLA's, and the Pallas flash kernel for training on a TPU.

``attention`` is the one definition (causal by position, optional sliding window and score soft-cap, grouped-query
heads) that the decoder's training forward and its paged inference path both use. ``flash_causal_attention``
computes the same function for rows at positions ``0 .. T-1`` with the scores kept blockwise on the chip;
``use_flash`` decides, from ``ATTENTION_KERNELS``' names, where the decoder's training forward runs it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash

from pipelines_lib.model.config import ModelConfig


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
the scores of every query against every key materialised in float32. ``flash``: the Pallas TPU flash-attention
kernel (blockwise, scores never leave the chip's vector memory), for models without soft-capped scores or sliding
layers, on one TPU device, with sequence lengths a multiple of 128. ``auto``: ``flash`` where it applies, else
``xla``. Both compute the same function; they differ by rounding (bfloat16 inputs, float32 accumulation)."""


def flash_unsupported(cfg: ModelConfig, seq_len: int) -> str | None:
    """Why the flash kernel cannot serve ``cfg`` at ``seq_len`` tokens here, or None when it can."""
    if cfg.attn_logit_softcap is not None:
        return "the model soft-caps its attention scores"
    if "sliding" in cfg.layer_kinds:
        return "the model has sliding-window layers"
    if seq_len % 128:
        return f"the sequence length {seq_len} is not a multiple of 128"
    if jax.default_backend() != "tpu":
        return f"it is a TPU kernel and JAX's backend is {jax.default_backend()!r}"
    if jax.device_count() > 1:
        # A Pallas call is not partitioned by the compiler: on a mesh it would run replicated.
        return f"it runs on one device and JAX sees {jax.device_count()}"
    return None


def use_flash(kernel: str, cfg: ModelConfig, seq_len: int) -> bool:
    """Whether ``final_hidden`` runs the flash kernel for ``kernel`` (an ``ATTENTION_KERNELS`` name); ``flash``
    where it cannot serve is a ``ValueError`` saying why."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {list(ATTENTION_KERNELS)}, got {kernel!r}")
    if kernel == "xla":
        return False
    reason = flash_unsupported(cfg, seq_len)
    if kernel == "flash" and reason is not None:
        raise ValueError(f"attention 'flash' cannot run here: {reason}; use 'auto' or 'xla'")
    return reason is None


def flash_causal_attention(q_bthd: jax.Array, k_btkd: jax.Array, v_btkd: jax.Array, *, scale: float) -> jax.Array:
    """``attention`` for queries and keys at positions ``0 .. T-1`` of each row (causal by index), by the Pallas
    flash kernel. The kernel wants as many key heads as query heads, so each kv head is repeated for its group
    (a copy of ``T × heads × head_dim`` per row: small beside the ``T²`` scores it keeps off the memory)."""
    t, group = q_bthd.shape[1], q_bthd.shape[2] // k_btkd.shape[2]
    # Blocks of 512 measured 2.9x faster than the kernel's default 128 for fwd + bwd at 8 x 1024 on a v5e.
    block = next(b for b in (512, 256, 128) if t % b == 0)
    sizes = pallas_flash.BlockSizes(
        block_q=block, block_k_major=block, block_k=block, block_b=1, block_q_major_dkv=block,
        block_k_major_dkv=block, block_k_dkv=block, block_q_dkv=block, block_k_major_dq=block, block_k_dq=block,
        block_q_dq=block)

    def heads_first(x_btkd: jax.Array, repeat: int) -> jax.Array:
        return jnp.repeat(x_btkd.transpose(0, 2, 1, 3), repeat, axis=1)

    o_bhtd = pallas_flash.flash_attention(heads_first(q_bthd, 1), heads_first(k_btkd, group),
                                          heads_first(v_btkd, group), causal=True, sm_scale=scale, block_sizes=sizes)
    return o_bhtd.transpose(0, 2, 1, 3)
