"""The memory roofline of a decode step: what one step must read, so a measured step time can be compared
with the time the device's memory bandwidth allows (``bytes / bandwidth``).

A decode step of a few hundred rows does little arithmetic per byte it reads, so its floor is the time to read
its inputs once: every weight, and the keys/values each row attends over. ``decode_step_bytes`` counts them;
the benchmark divides by the chip's bandwidth (819 GB/s on a TPU v5e) and compares with the measured step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder


def decode_step_bytes(cfg: ModelConfig, rows: int, span_positions: int) -> int:
    """Bytes one decode step over ``rows`` rows, each attending over ``span_positions`` positions, reads.

    * every parameter of every layer and the final norm, once (in ``cfg.dtype``, the serving dtype), whatever
      the row count: the rows share them;
    * of the embedding, only the rows' entries (a gather of ``rows × d_model``);
    * the unembedding, whole (``vocab × d_model``, the embedding again when tied): every row's logits cover
      the vocabulary;
    * per row, the keys and values of every layer at each of its ``span_positions`` (sliding-window layers
      included; padding rows count as rows). What the engine reads instead: where the decode kernel runs, the
      blocks up to each row's position (whole blocks); elsewhere the span bucket's blocks, gathered whole.

    Activations, logits and sampling are not counted: they stay small beside these for ``rows`` in the
    hundreds at most."""
    itemsize = jnp.dtype(cfg.dtype).itemsize
    shapes = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    embedding = cfg.vocab_size * cfg.d_model
    params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.to_pure_dict(shapes))) - embedding
    unembedding = embedding if cfg.tie_embeddings else 0  # an untied lm_head is among ``params`` already
    weights = (params + rows * cfg.d_model + unembedding) * itemsize
    kv = rows * span_positions * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * itemsize
    return weights + kv
