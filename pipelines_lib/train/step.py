"""The one train step (RL and SFT alike) and the jitted log-prob forward.

``train_step(model, optimizer, batch, ref_model, cfg=...)`` is a pure NNX step under ``nnx.jit``:
no IO, no clocks, metrics returned as arrays. What it optimises is chosen by ``cfg.loss.name`` from
the loss registry (``grpo`` for RL, ``nll`` for the SFT warm start); there is no second step.

Inside, in order:

1. aggregation weights for the *whole* batch (``losses.token_weights_bt``);
2. the batch is split into ``cfg.grad_accum_steps`` equal, row-strided micro-batches and a
   ``lax.scan`` sums their gradients, so only one micro-batch's activations (and, with the KL
   penalty on, its reference log-probs) are alive at a time.
   Because step 1 fixed the normaliser, the summed loss and gradient equal the full-batch ones
   (exact up to float summation order) for every aggregation;
3. one optimizer update with the summed gradient, in place: model and optimizer are donated.

Precision (``StepConfig.precision``): the parameters and Adam's moments stay in ``precision.params``;
each micro-batch's forward/backward runs on a ``precision.compute`` copy (``model.decoder.with_dtype``),
so the summed gradient and the update are in the master dtype. ``StepConfig.remat`` chooses what of each
layer's activations the backward pass recomputes instead of keeping.

Proximal log-probs: ``batch.prox_logp_bt = None`` uses the current parameters (stop-gradient),
which *is* the proximal policy when the batch receives one optimizer update — it saves a forward
pass. A trainer that makes several updates on one batch computes ``logprobs_fn(model, ...)`` once
before the first update and stores it in the batch.

The scan re-merges the model from its parameters per micro-batch; non-parameter state changed by a
forward (e.g. dropout RNG counters) is not carried between micro-batches. The decoder has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from pipelines_lib.model.attention import ATTENTION_KERNELS
from pipelines_lib.model.config import DTYPES
from pipelines_lib.model.decoder import REMAT_POLICIES, Decoder, with_dtype
from pipelines_lib.train.batch import TrainBatch
from pipelines_lib.train.losses import (
    LossConfig,
    LossInputs,
    get_loss,
    masked_quantile,
    token_logp_and_entropy,
    token_weights_bt,
)


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Dtypes of training: master weights and optimiser state in ``params``, forward/backward in ``compute``.

    ``{params: float32, compute: bfloat16}`` is mixed precision as accelerators run it: each micro-batch
    casts the float32 master weights to bfloat16, the gradient flows back through that cast into float32,
    and the update lands on float32 weights, so steps far below bfloat16's spacing (≈ 1.2e-4 at |w| ≈
    0.02) still accumulate. The trainer publishes the compute-dtype copy for the engines.
    """

    params: str = "float32"
    """Dtype of the trained parameters (and so of Adam's moments); the model must hold them in it."""
    compute: str = "float32"
    """Dtype of the forward and backward passes; logits, log-probs and the loss are float32 regardless."""

    def __post_init__(self) -> None:
        for name in ("params", "compute"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"Precision.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    """What one optimizer step computes (static under jit: changing it recompiles)."""

    loss: LossConfig = field(default_factory=LossConfig)
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; must divide the batch's row count."""
    precision: Precision = field(default_factory=Precision)
    """Master and compute dtypes (mixed precision when they differ)."""
    remat: str = "none"
    """Gradient checkpointing of the decoder's layers: what the backward pass keeps of each layer's forward.
    ``none``: every activation; ``full``: only each layer's input, the layer recomputed in the backward pass
    (least memory, about one more forward pass); ``dots``: the layer's input and its weight matmuls' outputs,
    recomputing only norms, rope, attention and activations (more memory than ``full``, less recomputation);
    ``attention``: ``full`` plus the flash kernel's output and softmax statistics where it runs, so the backward
    pass does not run the kernel's forward again (one token × width buffer per layer more; faster than ``full`` on a
    TPU v5e: ``tpu.train_mfu_remat_attention`` against ``tpu.train_mfu_remat_full`` in bench/results.json). The gradients are the same under every choice (``model.decoder.REMAT_POLICIES``)."""
    attention: str = "auto"
    """How the forward passes compute attention (``model.attention.ATTENTION_KERNELS``): ``auto`` runs the Pallas
    splash (flash) attention kernel on a single TPU device where the model allows it (no sliding layers, sequence
    length a multiple of 128) and XLA's attention elsewhere; ``xla`` always XLA's; ``flash`` the kernel or an
    error saying why it cannot run. The same function either way, up to rounding; on a TPU v5e the kernel made a
    0.6 B model's step at 8 × 1024 tokens faster (BENCHMARKS.md, ``tpu_train``)."""
    logit_chunk_tokens: int = 256
    """Bound on the float32 logits alive at once when scoring (``losses.token_logp_and_entropy``): the
    vocabulary is unembedded a slice at a time, the slice sized so that its logits (and their softmax and
    gradient) for the micro-batch's tokens are no larger than this many tokens' full logits (``tokens × vocab ×
    4`` bytes each: 0.15 GiB at 256 tokens and a 152k vocabulary) instead of the whole micro-batch's. Smaller
    saves memory for more, smaller unembedding matmuls; the figures are the same."""

    def __post_init__(self) -> None:
        if self.grad_accum_steps < 1:
            raise ValueError(f"StepConfig.grad_accum_steps must be >= 1, got {self.grad_accum_steps}")
        if self.logit_chunk_tokens < 1:
            raise ValueError(f"StepConfig.logit_chunk_tokens must be >= 1, got {self.logit_chunk_tokens}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"StepConfig.remat must be one of {sorted(REMAT_POLICIES)}, got {self.remat!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise ValueError(f"StepConfig.attention must be one of {list(ATTENTION_KERNELS)}, got {self.attention!r}")


def _forward_logp_entropy(
    model: Decoder, tokens_bt: jax.Array, positions_bt: jax.Array, *, chunk_tokens: int, remat: str = "none",
    attention: str = "auto",
) -> tuple[jax.Array, jax.Array]:
    h_btd = model.final_hidden(tokens_bt, positions_bt, remat=remat, attention=attention)
    return token_logp_and_entropy(h_btd, tokens_bt, model.unembedding_vd(), softcap=model.cfg.final_logit_softcap,
                                  chunk_tokens=chunk_tokens)


@partial(nnx.jit, static_argnames=("logit_chunk_tokens",))
def logprobs_fn(model: nnx.Module, tokens_bt: jax.Array, positions_bt: jax.Array, *,
                logit_chunk_tokens: int = StepConfig.logit_chunk_tokens) -> jax.Array:
    """``logp_bt[:, t] = log p_θ(tokens_bt[:, t] | tokens_bt[:, :t])``; column 0 is 0.

    The alignment of the trajectory schema's ``logprobs`` column and of ``TrainBatch.behav_logp_bt``,
    so the three can be compared token by token. ``logit_chunk_tokens``: as ``StepConfig``'s.
    """
    return _forward_logp_entropy(model, tokens_bt, positions_bt, chunk_tokens=logit_chunk_tokens)[0]


def _split_micro(x_b: jax.Array | None, n_micro: int) -> jax.Array | None:
    """``[B, ...] -> [n_micro, B / n_micro, ...]`` with micro-batch ``j`` = rows ``j, j + n, j + 2n, ...``.

    Strided rather than contiguous: with rows sharded contiguously over devices, every micro-batch
    then keeps rows on every device instead of living on a subset of them.
    """
    if x_b is None:
        return None
    return x_b.reshape(x_b.shape[0] // n_micro, n_micro, *x_b.shape[1:]).swapaxes(0, 1)


def batch_rows(batch: TrainBatch, cfg: StepConfig) -> dict[str, jax.Array | None]:
    """The per-row arrays a loss reads, with the aggregation weights of the *whole* batch (``[B, ...]`` each)."""
    loss_mask_bt = batch.loss_mask_bt.astype(jnp.float32)
    return {
        "tokens_bt": batch.tokens_bt,
        "positions_bt": batch.positions_bt,
        "loss_mask_bt": loss_mask_bt,
        "behav_logp_bt": batch.behav_logp_bt,
        "advantages_bt": batch.advantages_bt,
        "prox_logp_bt": batch.prox_logp_bt,
        "weight_bt": token_weights_bt(loss_mask_bt, cfg.loss.aggregation),
        "metric_weight_bt": token_weights_bt(loss_mask_bt, "token_mean"),
    }


def loss_inputs(model: Decoder, rows: dict[str, jax.Array | None], *, cfg: StepConfig,
                ref_model: Decoder | None = None) -> LossInputs:
    """``LossInputs`` of ``rows`` (``batch_rows`` or a micro-batch of them): forward passes in the compute dtype,
    the proximal log-probs defaulting to the current ones (stop-gradient)."""
    logp_bt, entropy_bt = _forward_logp_entropy(
        with_dtype(model, cfg.precision.compute), rows["tokens_bt"], rows["positions_bt"],
        chunk_tokens=cfg.logit_chunk_tokens, remat=cfg.remat, attention=cfg.attention,
    )
    prox_logp_bt = rows["prox_logp_bt"]
    ref_logp_bt = None
    if ref_model is not None:
        ref_model_c = with_dtype(ref_model, cfg.precision.compute)
        ref_logp_bt = jax.lax.stop_gradient(_forward_logp_entropy(
            ref_model_c, rows["tokens_bt"], rows["positions_bt"], chunk_tokens=cfg.logit_chunk_tokens,
            attention=cfg.attention)[0])
    return LossInputs(
        logp_bt=logp_bt,
        prox_logp_bt=jax.lax.stop_gradient(logp_bt) if prox_logp_bt is None else prox_logp_bt,
        behav_logp_bt=rows["behav_logp_bt"],
        advantages_bt=rows["advantages_bt"],
        loss_mask_bt=rows["loss_mask_bt"],
        weight_bt=rows["weight_bt"],
        metric_weight_bt=rows["metric_weight_bt"],
        entropy_bt=entropy_bt,
        ref_logp_bt=ref_logp_bt,
    )


@partial(nnx.jit, static_argnames=("cfg",), donate_argnums=(0, 1))
def train_step(
    model: Decoder,
    optimizer: nnx.Optimizer,
    batch: TrainBatch,
    ref_model: Decoder | None = None,
    *,
    cfg: StepConfig,
) -> dict[str, jax.Array]:
    """One optimizer update of ``model`` on ``batch``; returns scalar metrics.

    ``model`` and ``optimizer`` are donated: the update writes the new parameters and Adam moments
    into the buffers of the old ones, so they exist once, not twice, at the step's peak. Their arrays
    from before the call are invalid after it (``model`` and ``optimizer`` themselves hold the new ones);
    anything else holding those arrays (an engine given the same parameters) must hold a copy.

    Metrics: ``loss``, ``grad_norm`` (before clipping), ``loss_tokens``, ``entropy``, ``kl`` (with
    a reference) and the loss's own (``losses.grpo_loss``: clip fractions, ratio and behaviour
    weight statistics, ``prox_behav_logp_abs_diff``; ``losses.nll_loss``: ``nll``). Token means are
    over the loss tokens of the whole batch.

    The training–inference mismatch, per step, on loss tokens: ``prox_behav_logp_abs_diff`` (mean) and
    ``prox_behav_logp_abs_diff_p99`` of ``|logp_trainer − logp_sampler|`` (the trainer's logprob before the
    update against the engine's recorded one), ``behav_prox_kl`` (KL(π_behav ‖ π_prox), k3 estimate),
    ``behav_weight_capped_frac``, the share of tokens the configured correction capped or masked, and
    ``correction_frac_<name>``, that share for every registered correction. ~0 for the built-in engine (same
    numerics) on fresh data; an inference server's kernels and stale groups show up here.
    """
    n_rows = batch.tokens_bt.shape[0]
    n_micro = cfg.grad_accum_steps
    if n_rows % n_micro:
        raise ValueError(f"batch of {n_rows} rows does not split into grad_accum_steps={n_micro}")
    if cfg.loss.kl_coef > 0 and ref_model is None:
        raise ValueError(f"kl_coef={cfg.loss.kl_coef} needs a ref_model")
    loss_fn = get_loss(cfg.loss.name)

    per_row = batch_rows(batch, cfg)
    loss_mask_bt = per_row["loss_mask_bt"]
    micro_batches = {k: _split_micro(v, n_micro) for k, v in per_row.items()}

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    wrong = next((p for p in jax.tree.leaves(params) if p.dtype != jnp.dtype(cfg.precision.params)), None)
    if wrong is not None:
        raise ValueError(f"train_step: model parameters are {wrong.dtype}, precision.params is {cfg.precision.params}")
    # The reference runs inside the scan too, so its logits also exist for one micro-batch at a time.
    use_ref = cfg.loss.kl_coef > 0
    ref_graphdef, ref_state = nnx.split(ref_model) if use_ref else (None, None)

    def micro_loss(params: nnx.State, micro: dict[str, jax.Array | None]):
        ref = nnx.merge(ref_graphdef, ref_state) if use_ref else None
        inputs = loss_inputs(nnx.merge(graphdef, params, rest), micro, cfg=cfg, ref_model=ref)
        loss, metrics = loss_fn(inputs, cfg.loss)
        # Per token, for the batch-wide p99 of the training–inference mismatch (a quantile does not add up over
        # micro-batches as the means do).
        mismatch_bt = jax.lax.stop_gradient(jnp.abs(inputs.prox_logp_bt - inputs.behav_logp_bt))
        return loss, (metrics, mismatch_bt)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def accumulate(grads_sum: nnx.State, micro: dict[str, jax.Array | None]):
        (loss, metrics), grads = grad_fn(params, micro)
        return jax.tree.map(jnp.add, grads_sum, grads), (loss, metrics)

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, (loss_m, (metrics_m, mismatch_m)) = jax.lax.scan(accumulate, zeros, micro_batches)
    optimizer.update(model, grads)

    out = {
        "loss": loss_m.sum(),
        "grad_norm": optax.global_norm(grads),
        "loss_tokens": loss_mask_bt.sum(),
        **{k: v.sum() for k, v in metrics_m.means.items()},
        **{k: v.max() for k, v in metrics_m.maxes.items()},
    }
    if "prox_behav_logp_abs_diff" in out:  # a loss that uses the sampler's logprobs: report the mismatch's tail
        out["prox_behav_logp_abs_diff_p99"] = masked_quantile(mismatch_m, micro_batches["loss_mask_bt"], 0.99)
    return out
