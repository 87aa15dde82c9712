"""Policy losses (pure ``jnp``), their token aggregation, and the metrics they report.

How the pieces fit:

* ``token_logp_and_entropy`` turns the model's final hidden states into per-token log-probs and entropies,
  unembedding a slice of the vocabulary at a time, with the alignment the whole pipeline uses: ``logp_bt[:, t]``
  scores ``tokens_bt[:, t]`` given ``tokens_bt[:, :t]`` (so column 0 is 0 and is never a loss token),
  exactly like the trajectory schema's ``logprobs`` column.
* An **aggregation** (``AGGREGATIONS``) turns the full batch's loss mask into ``weight_bt``, and
  every loss is ``Σ_bt weight_bt · loss_bt``. Because the weights are computed once over the *whole*
  batch, the losses of micro-batch slices sum to the full-batch loss exactly; gradient accumulation
  is a plain sum (``step.py``).
* A **correction** (``CORRECTIONS``: ``tis``, ``mis``, ``icepop``, ``geo_mask``, ``none``) turns the
  behaviour-to-proximal log-ratio ``log ρ = logp_prox − logp_behav`` into the constant per-token weight the
  ``grpo`` surrogate is multiplied by, and says which tokens it capped or masked. The loss applies the one
  ``LossConfig.correction`` names and reports, for every registered correction, the share of tokens it would
  cap or mask on the same batch, so one run shows what each would have done.
* A **loss** (``LOSSES``: ``grpo`` for RL, ``nll`` for the SFT warm start) maps ``LossInputs`` to
  ``(loss, LossMetrics)``. Metric means are pre-weighted by ``mask / global loss-token count`` so
  they, too, sum over micro-batches; metric maxima combine by ``max``.

Configs name a loss, an aggregation and a correction; ``LossConfig`` validates them against the registries' keys.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from pipelines_lib.configio import no_limit
from pipelines_lib.model.decoder import unembed_logits
from pipelines_lib.registry import registering

# k3 = exp(d) − d − 1 grows like exp(d); a token the reference finds e^20 times likelier than the
# policy would dominate the batch, so the log-ratio is clamped (as verl does) before exponentiating.
_KL_LOG_RATIO_CLAMP = 20.0


class LossInputs(NamedTuple):
    """Per-token arrays of one (micro-)batch, all ``[B, T]`` and aligned as in ``token_logp_and_entropy``."""

    logp_bt: jax.Array
    """Log-prob of each token under the parameters being trained (carries the gradient)."""
    prox_logp_bt: jax.Array
    """Proximal log-probs: the trainer's own before this update (constant)."""
    behav_logp_bt: jax.Array
    """Behaviour log-probs recorded by the sampler that generated the tokens (constant)."""
    advantages_bt: jax.Array
    loss_mask_bt: jax.Array
    """1.0 on tokens the policy generated, 0.0 on prompt, tool output and padding."""
    weight_bt: jax.Array
    """Aggregation weights computed over the whole batch (``token_weights_bt``)."""
    metric_weight_bt: jax.Array
    """``loss_mask / (loss tokens in the whole batch)``: turns sums into batch-wide token means."""
    entropy_bt: jax.Array
    """Entropy of the trainer's next-token distribution that scored each token (constant)."""
    ref_logp_bt: jax.Array | None = None
    """Log-probs under a frozen reference model; required when ``kl_coef > 0``."""


class LossMetrics(NamedTuple):
    """Metrics of one (micro-)batch: ``means`` add up across micro-batches, ``maxes`` combine by max."""

    means: dict[str, jax.Array]
    maxes: dict[str, jax.Array]


# ----------------------------------------------------------------------------- aggregation

AggregationFn = Callable[[jax.Array], jax.Array]
AGGREGATIONS: dict[str, AggregationFn] = {}


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    """Register a ``loss_mask_bt -> weight_bt`` aggregation under ``name``."""
    return registering(AGGREGATIONS, "aggregation", name)


@register_aggregation("token_mean")
def token_mean_weights(loss_mask_bt: jax.Array) -> jax.Array:
    """Every loss token of the batch weighs the same (DAPO's token-level policy-gradient loss, Yu et al. 2025)."""
    return loss_mask_bt / jnp.maximum(loss_mask_bt.sum(), 1.0)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean_weights(loss_mask_bt: jax.Array) -> jax.Array:
    """Mean over each sequence's loss tokens, then over sequences (GRPO, Shao et al. 2024, Eq. 3).

    Rows without a loss token (padding rows) are not counted as sequences.
    """
    tokens_b1 = loss_mask_bt.sum(axis=1, keepdims=True)
    n_sequences = (tokens_b1 > 0).sum()
    return loss_mask_bt / jnp.maximum(tokens_b1, 1.0) / jnp.maximum(n_sequences, 1)


def token_weights_bt(loss_mask_bt: jax.Array, aggregation: str) -> jax.Array:
    """Aggregation weights of the *whole* batch; slice them per micro-batch, never recompute them."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[aggregation](loss_mask_bt.astype(jnp.float32))


def vocab_chunks(vocab: int, at_least: int) -> int:
    """How many slices the vocabulary is cut into: the fewest ``>= at_least`` that divide ``vocab`` evenly (no
    padded copy of the unembedding), if one is at most twice ``at_least``; else ``at_least`` (never above
    ``vocab``), the last slice padded."""
    at_least = min(max(at_least, 1), vocab)
    return next((k for k in range(at_least, 2 * at_least + 1) if vocab % k == 0), at_least)


_SLICE_RESIDUALS = ("vocab_slice_max", "vocab_slice_sumexp")
"""Per-token statistics of a vocabulary slice its backward pass keeps instead of recomputing."""


def token_logp_and_entropy(
    h_btd: jax.Array, tokens_bt: jax.Array, w_vd: jax.Array, *, softcap: float | None, chunk_tokens: int
) -> tuple[jax.Array, jax.Array]:
    """Next-token log-probs and entropies of final hidden states, aligned to the scored token.

    With ``z = unembed_logits(h_btd, w_vd, softcap)`` (float32 logits ``[B, T, V]``):
    ``logp_bt[:, t] = log softmax(z[:, t − 1])[tokens_bt[:, t]]`` for ``t ≥ 1`` and
    ``entropy_bt[:, t] = H(softmax(z[:, t − 1]))``; column 0 has no prefix and is 0.
    Entropy is a metric only, so it carries no gradient.

    ``z`` is never built whole. A ``lax.map`` over ``K`` slices of the vocabulary (rows of ``w_vd``) computes,
    for every token, each slice's log-sum-exp ``lse_k``, its logit of the next token (0 if that is in another
    slice) and its mean logit under the slice's own softmax ``E_k``; then ``lse = logsumexp_k lse_k``,
    ``logp = Σ_k target_k − lse`` and ``H = lse − Σ_k exp(lse_k − lse) · E_k``. ``K`` makes a slice's logits
    ``[B·T, V / K]`` no larger than ``chunk_tokens`` tokens' full logits. Each slice is ``jax.checkpoint``-ed,
    keeping only its per-token maximum and sum of exponentials (``_SLICE_RESIDUALS``), so the backward pass
    recomputes its logits rather than saving them: logits, softmax and their gradient
    exist one slice at a time (at a 152k vocabulary the whole of each is 0.6 GiB per 1k tokens in float32),
    for one more unembedding matmul. Slicing the vocabulary rather than the tokens keeps the unembedding's
    gradient free of accumulation: slice ``k``'s rows get their gradient from slice ``k`` alone, written once
    (a token slice would add a ``[V, D]`` gradient per slice into a ``[V, D]`` sum); what accumulates is the
    hidden states' gradient, ``[B·T, D]``. The figures are the unsliced ones up to float rounding.
    """
    b, t, d = h_btd.shape
    vocab = w_vd.shape[0]
    h_nd = h_btd.reshape(b * t, d)
    next_n = jnp.concatenate([tokens_bt[:, 1:], tokens_bt[:, -1:]], axis=1).reshape(b * t)
    k = vocab_chunks(vocab, -(-b * t // chunk_tokens))
    rows = -(-vocab // k)
    w_kcd = jnp.pad(w_vd, ((0, k * rows - vocab), (0, 0))).reshape(k, rows, d)

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names(*_SLICE_RESIDUALS))
    def slice_stats(w_cd: jax.Array, first: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        real_c = first + jnp.arange(rows) < vocab
        # Padding rows (ids past the vocabulary) get the lowest finite logit: exp() makes them 0, and a slice of
        # padding only would still have a finite log-sum-exp (-inf would turn its gradient into NaN).
        z_nc = jnp.where(real_c, unembed_logits(h_nd, w_cd, softcap), jnp.finfo(jnp.float32).min)
        # Two passes over the logits: their maximum, then the exponentials' sum and the mean logit together (one
        # fusion reading z once). The backward pass keeps the two small per-token statistics, so it recomputes
        # only the matmul and exp(z - max), not the reductions.
        max_n = checkpoint_name(jax.lax.stop_gradient(jnp.max(z_nc, axis=-1)), _SLICE_RESIDUALS[0])
        e_nc = jnp.exp(z_nc - max_n[:, None])
        sum_n = checkpoint_name(jnp.sum(e_nc, axis=-1), _SLICE_RESIDUALS[1])
        # The shift by a constant leaves the log-sum-exp and its gradient (the softmax) as they are.
        lse_n = max_n + jnp.log(sum_n)
        local_n = next_n - first
        in_slice_n = (local_n >= 0) & (local_n < rows)
        picked_n = jnp.take_along_axis(z_nc, jnp.clip(local_n, 0, rows - 1)[:, None], axis=-1)[:, 0]
        target_n = jnp.where(in_slice_n, picked_n, 0.0)
        # Padding contributes 0, not exp(0) · min: a slice of padding only would sum that to -inf.
        weighted_n = jnp.sum(e_nc * jnp.where(real_c, z_nc, 0.0), axis=-1)
        mean_z_n = jax.lax.stop_gradient(weighted_n / sum_n)
        return lse_n, target_n, mean_z_n

    lse_kn, target_kn, mean_z_kn = jax.lax.map(lambda xs: slice_stats(*xs), (w_kcd, jnp.arange(k) * rows))
    lse_n = jax.nn.logsumexp(lse_kn, axis=0)
    logp_n = target_kn.sum(axis=0) - lse_n
    share_kn = jnp.exp(jax.lax.stop_gradient(lse_kn - lse_n))
    entropy_n = jax.lax.stop_gradient(lse_n) - jnp.sum(share_kn * mean_z_kn, axis=0)

    def scored_bt(x_n: jax.Array) -> jax.Array:
        # Position t's figure scores token t + 1: shift right by one, column 0 (no prefix) is 0.
        x_bt = x_n.reshape(b, t)
        return jnp.concatenate([jnp.zeros_like(x_bt[:, :1]), x_bt[:, :-1]], axis=1)

    return scored_bt(logp_n), scored_bt(entropy_n)


# ----------------------------------------------------------------------------- off-policy corrections

CorrectionFn = Callable[[jax.Array, jax.Array, "LossConfig"], tuple[jax.Array, jax.Array]]
CORRECTIONS: dict[str, CorrectionFn] = {}


def register_correction(name: str) -> Callable[[CorrectionFn], CorrectionFn]:
    """Register a ``(log_rho_bt, mask_bt, cfg) -> (weight_bt, flagged_bt)`` correction under ``name``.

    ``log_rho_bt = logp_prox − logp_behav`` (0 off the mask); ``weight_bt`` multiplies each token's surrogate
    and carries no gradient; ``flagged_bt`` is 1.0 where the correction capped or masked the token.
    """
    return registering(CORRECTIONS, "correction", name)


def _in_band(x: jax.Array, low: float, high: float) -> jax.Array:
    return (x >= low) & (x <= high)


@register_correction("tis")
def tis_weights(log_rho_bt: jax.Array, mask_bt: jax.Array, cfg: LossConfig) -> tuple[jax.Array, jax.Array]:
    """Truncated importance sampling (the decoupled objective's capped weight; Yao et al. 2025 "TIS"):

      ``w_t = min(ρ_t, C)``, ``ρ_t = π_prox(y_t) / π_behav(y_t)``, ``C = behav_weight_cap``.

    Every token keeps its gradient; those with ``ρ_t ≥ C`` are flagged as capped.
    """
    log_cap = math.log(cfg.behav_weight_cap)
    return jnp.exp(jnp.minimum(log_rho_bt, log_cap)), (log_rho_bt >= log_cap) * mask_bt


@register_correction("mis")
def mis_weights(log_rho_bt: jax.Array, mask_bt: jax.Array, cfg: LossConfig) -> tuple[jax.Array, jax.Array]:
    """Masked importance sampling (Yao et al. 2025 "MIS"): tokens whose ratio exceeds the cap lose their gradient.

      ``w_t = ρ_t · 1[ρ_t ≤ C]``, ``C = behav_weight_cap``.

    Unlike TIS, a token the sampler found far less likely than the trainer does is dropped, not down-weighted.
    """
    keep_bt = log_rho_bt <= math.log(cfg.behav_weight_cap)
    return jnp.where(keep_bt, jnp.exp(log_rho_bt), 0.0), (~keep_bt) * mask_bt


@register_correction("icepop")
def icepop_weights(log_rho_bt: jax.Array, mask_bt: jax.Array, cfg: LossConfig) -> tuple[jax.Array, jax.Array]:
    """IcePop two-sided masking (Ling Team 2025, Ring-1T): keep the ratio inside a band, mask it outside.

      ``w_t = ρ_t · 1[α ≤ ρ_t ≤ β]``, ``α = mask_low``, ``β = mask_high``.

    Masks both tails: tokens the sampler over-rated (``ρ < α``) as well as under-rated (``ρ > β``).
    """
    rho_bt = jnp.exp(log_rho_bt)
    keep_bt = _in_band(rho_bt, cfg.mask_low, cfg.mask_high)
    return jnp.where(keep_bt, rho_bt, 0.0), (~keep_bt) * mask_bt


@register_correction("geo_mask")
def geo_mask_weights(log_rho_bt: jax.Array, mask_bt: jax.Array, cfg: LossConfig) -> tuple[jax.Array, jax.Array]:
    """Sequence-level geometric-mean masking (veRL's ``geo`` rollout-IS level), over TIS weights:

      ``g_b = exp(Σ_t m_bt log ρ_bt / Σ_t m_bt)``,  ``w_bt = min(ρ_bt, C) · 1[α ≤ g_b ≤ β]``

    (``α = mask_low``, ``β = mask_high``, ``C = behav_weight_cap``). A sequence whose tokens drifted as a whole
    is dropped entirely; the per-sequence mean does not grow with length as a product of ratios would. Every
    loss token of a dropped sequence is flagged.
    """
    n_b1 = jnp.maximum(mask_bt.sum(axis=1, keepdims=True), 1.0)
    geo_b1 = jnp.exp((log_rho_bt * mask_bt).sum(axis=1, keepdims=True) / n_b1)
    keep_b1 = _in_band(geo_b1, cfg.mask_low, cfg.mask_high)
    tis_bt, _ = tis_weights(log_rho_bt, mask_bt, cfg)
    return jnp.where(keep_b1, tis_bt, 0.0), (~keep_b1) * mask_bt


@register_correction("none")
def no_correction_weights(log_rho_bt: jax.Array, mask_bt: jax.Array, cfg: LossConfig) -> tuple[jax.Array, jax.Array]:
    """No off-policy correction: ``w_t = 1``. Stale samples are trained as if the proximal policy had drawn them
    (the ablation's uncorrected arm)."""
    return jnp.ones_like(log_rho_bt), jnp.zeros_like(mask_bt)


# ----------------------------------------------------------------------------- losses

LossFn = Callable[[LossInputs, "LossConfig"], tuple[jax.Array, LossMetrics]]
LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Register a ``(LossInputs, LossConfig) -> (loss, LossMetrics)`` loss under ``name``."""

    return registering(LOSSES, "loss", name)


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
    return LOSSES[name]


def _masked_max(x_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """Max over loss tokens of a non-negative quantity (0 when there are none)."""
    return jnp.where(mask_bt > 0, x_bt, 0.0).max()


def masked_quantile(x_bt: jax.Array, mask_bt: jax.Array, q: float) -> jax.Array:
    """Nearest-rank ``q``-quantile of ``x_bt`` over the entries where ``mask_bt > 0`` (0 when there are none).

    With ``n`` masked-in values sorted ascending ``x_(1) <= ... <= x_(n)`` it is ``x_(k)``, ``k = max(1, ⌈q·n⌉)``:
    the p99 of 200 values is the 198th smallest. Masked-out entries sort first as ``-inf``, so the k-th of the
    n valid values sits at index ``size − n + k − 1`` of the whole sorted array.
    """
    flat = jnp.where(mask_bt > 0, x_bt, -jnp.inf).ravel()
    n = (mask_bt > 0).sum()
    k = jnp.maximum(1, jnp.ceil(q * n).astype(jnp.int32))
    value = jnp.sort(flat)[jnp.clip(flat.size - n + k - 1, 0, flat.size - 1)]
    return jnp.where(n > 0, value, 0.0)


def k3_kl_bt(logp_bt: jax.Array, ref_logp_bt: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref) (Schulman 2020, "Approximating KL divergence").

    ``k3 = exp(d) − d − 1`` with ``d = log π_ref − log π_θ``: unbiased for tokens sampled from π_θ,
    and never negative.
    """
    d_bt = jnp.clip(ref_logp_bt - logp_bt, -_KL_LOG_RATIO_CLAMP, _KL_LOG_RATIO_CLAMP)
    return jnp.exp(d_bt) - d_bt - 1.0


def _entropy_and_kl(x: LossInputs, mask_bt: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    """Metrics shared by every loss, and the per-token KL (zeros without a reference)."""
    means = {"entropy": (x.entropy_bt * x.metric_weight_bt).sum()}
    if x.ref_logp_bt is None:
        return means, jnp.zeros_like(x.logp_bt)
    kl_bt = jnp.where(mask_bt > 0, k3_kl_bt(x.logp_bt, x.ref_logp_bt), 0.0)
    means["kl"] = (jax.lax.stop_gradient(kl_bt) * x.metric_weight_bt).sum()
    return means, kl_bt


@register_loss("grpo")
def grpo_loss(x: LossInputs, cfg: LossConfig) -> tuple[jax.Array, LossMetrics]:
    """Clipped GRPO surrogate with decoupled off-policy correction (ARCHITECTURE §6).

    Per loss token, to be maximised (the returned loss is its negated weighted sum):

      ``J_t = w_t · min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t) − β · k3_t``

    * ``r_t = exp(logp_θ − logp_prox)``: PPO ratio against the proximal policy (Schulman et al.
      2017, Eq. 7), with DAPO's decoupled clip range ε_low / ε_high ("clip-higher", Yu et al. 2025).
    * ``w_t``: the importance weight from the sampler's behaviour policy to the proximal one, as the
      correction ``cfg.correction`` shapes it from ``ρ_t = exp(logp_prox − logp_behav)`` (``CORRECTIONS``;
      the default ``tis`` is ``min(ρ_t, C)``: "decoupled PPO", Hilton et al. 2022; AReaL's decoupled
      objective, Fu et al. 2025). With ``logp_prox == logp_behav`` every correction gives 1 and ``J_t`` is
      ordinary clipped GRPO (Shao et al. 2024, Eq. 3).
    * ``k3_t``: KL to a frozen reference (``k3_kl_bt``), only when ``cfg.kl_coef > 0``.

    Reported clip fractions count tokens whose gradient the clip removed: ``low`` where
    ``A < 0 and r < 1 − ε_low``, ``high`` where ``A > 0 and r > 1 + ε_high``. The behaviour–proximal mismatch:
    ``behav_weight_capped_frac`` (tokens the applied correction capped or masked), ``correction_frac_<name>``
    (the same share for every registered correction), ``prox_behav_logp_abs_diff`` (mean ``|log ρ|``) and
    ``behav_prox_kl`` (k3 estimate of KL(π_behav ‖ π_prox) on the sampled tokens).
    """
    mask_bt = x.loss_mask_bt
    # Off-mask entries (padding, prompt) hold arbitrary log-probs; zeroing the exponents there keeps
    # exp() finite so 0-weights never meet inf (0 · inf = NaN, in values and in gradients).
    log_ratio_bt = jnp.where(mask_bt > 0, x.logp_bt - jax.lax.stop_gradient(x.prox_logp_bt), 0.0)
    log_behav_bt = jnp.where(mask_bt > 0, x.prox_logp_bt - x.behav_logp_bt, 0.0)
    ratio_bt = jnp.exp(log_ratio_bt)
    log_behav_bt = jax.lax.stop_gradient(log_behav_bt)
    behav_weight_bt, flagged_bt = CORRECTIONS[cfg.correction](log_behav_bt, mask_bt, cfg)
    advantages_bt = x.advantages_bt
    clipped_ratio_bt = jnp.clip(ratio_bt, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    surrogate_bt = behav_weight_bt * jnp.minimum(ratio_bt * advantages_bt, clipped_ratio_bt * advantages_bt)

    means, kl_bt = _entropy_and_kl(x, mask_bt)
    loss_bt = -surrogate_bt + cfg.kl_coef * kl_bt
    loss = (loss_bt * x.weight_bt).sum()

    ratio_const_bt = jax.lax.stop_gradient(ratio_bt)
    clipped_low_bt = (advantages_bt < 0) & (ratio_const_bt < 1.0 - cfg.eps_low)
    clipped_high_bt = (advantages_bt > 0) & (ratio_const_bt > 1.0 + cfg.eps_high)
    m_bt = x.metric_weight_bt
    means |= {
        "clip_frac_low": (clipped_low_bt * m_bt).sum(),
        "clip_frac_high": (clipped_high_bt * m_bt).sum(),
        "ratio_mean": (ratio_const_bt * m_bt).sum(),
        "behav_weight_mean": (behav_weight_bt * m_bt).sum(),
        "behav_weight_capped_frac": (flagged_bt * m_bt).sum(),
        "prox_behav_logp_abs_diff": (jnp.abs(log_behav_bt) * m_bt).sum(),
        # Tokens are sampled from π_behav, so k3 with d = logp_prox − logp_behav estimates KL(π_behav ‖ π_prox).
        "behav_prox_kl": (k3_kl_bt(jnp.zeros_like(log_behav_bt), log_behav_bt) * m_bt).sum(),
    }
    for name, correction in CORRECTIONS.items():
        means[f"correction_frac_{name}"] = (correction(log_behav_bt, mask_bt, cfg)[1] * m_bt).sum()
    maxes = {
        "ratio_max": _masked_max(ratio_const_bt, mask_bt),
        "behav_weight_max": _masked_max(behav_weight_bt, mask_bt),
    }
    return loss, LossMetrics(means=means, maxes=maxes)


@register_loss("nll")
def nll_loss(x: LossInputs, cfg: LossConfig) -> tuple[jax.Array, LossMetrics]:
    """Supervised negative log-likelihood of the loss tokens (the SFT warm start).

    ``L = −Σ_bt weight_bt · logp_θ[b, t]`` (plus ``β · k3`` when a reference is given);
    advantages and behaviour log-probs are ignored.
    """
    mask_bt = x.loss_mask_bt
    means, kl_bt = _entropy_and_kl(x, mask_bt)
    nll_bt = jnp.where(mask_bt > 0, -x.logp_bt, 0.0)
    loss = ((nll_bt + cfg.kl_coef * kl_bt) * x.weight_bt).sum()
    means["nll"] = (jax.lax.stop_gradient(nll_bt) * x.metric_weight_bt).sum()
    return loss, LossMetrics(means=means, maxes={})


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Which loss, how tokens are aggregated, and the surrogate's constants."""

    name: str = "grpo"
    """A key of ``LOSSES``: ``grpo`` (RL) or ``nll`` (SFT)."""
    aggregation: str = "token_mean"
    """A key of ``AGGREGATIONS``."""
    eps_low: float = 0.2
    """Lower clip range: r is clipped at ``1 − eps_low``."""
    eps_high: float = 0.28
    """Upper clip range: r is clipped at ``1 + eps_high`` (DAPO's clip-higher default)."""
    correction: str = "tis"
    """A key of ``CORRECTIONS``: how the behaviour-to-proximal ratio ρ weights each token (``tis``, ``mis``,
    ``icepop``, ``geo_mask``, ``none``)."""
    behav_weight_cap: float = no_limit(5.0)
    """C of ``tis`` (``w = min(ρ, C)``), ``mis`` (``w = ρ·1[ρ ≤ C]``) and ``geo_mask``; ``math.inf`` disables it."""
    mask_low: float = 0.5
    """α: lower edge of the band ``icepop`` keeps per token and ``geo_mask`` per sequence (geometric mean)."""
    mask_high: float = 2.0
    """β: upper edge of that band."""
    kl_coef: float = 0.0
    """β of the k3 KL penalty to the reference model; 0 disables it (and the reference forward)."""

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"LossConfig.name: unknown loss {self.name!r}; choose one of {sorted(LOSSES)}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"LossConfig.aggregation: unknown {self.aggregation!r}; choose one of {sorted(AGGREGATIONS)}"
            )
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"LossConfig.eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0.0:
            raise ValueError(f"LossConfig.eps_high must be >= 0, got {self.eps_high}")
        if self.correction not in CORRECTIONS:
            raise ValueError(
                f"LossConfig.correction: unknown {self.correction!r}; choose one of {sorted(CORRECTIONS)}"
            )
        if not 0.0 < self.mask_low <= 1.0 <= self.mask_high:
            raise ValueError(f"LossConfig.mask_low/mask_high must satisfy 0 < low <= 1 <= high, got "
                             f"{self.mask_low}/{self.mask_high}")
        if not self.behav_weight_cap > 0.0:
            raise ValueError(f"LossConfig.behav_weight_cap must be > 0, got {self.behav_weight_cap}")
        if self.kl_coef < 0.0:
            raise ValueError(f"LossConfig.kl_coef must be >= 0, got {self.kl_coef}")
