"""Golden numbers for the GRPO / NLL losses, their aggregation and their metrics."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from pipelines_lib.model.decoder import unembed_logits
from pipelines_lib.train.losses import (
    CORRECTIONS,
    LossConfig,
    LossInputs,
    get_loss,
    k3_kl_bt,
    token_logp_and_entropy,
    token_weights_bt,
    vocab_chunks,
)

CFG = LossConfig(eps_low=0.2, eps_high=0.28, behav_weight_cap=5.0)


def make_inputs(
    logp_bt,
    *,
    prox_logp_bt=None,
    behav_logp_bt=None,
    advantages_bt=None,
    loss_mask_bt=None,
    ref_logp_bt=None,
    aggregation: str = "token_mean",
) -> LossInputs:
    """Inputs with defaults: prox = behav = logp (on-policy), A = 1, every token a loss token."""
    logp_bt = jnp.asarray(logp_bt, jnp.float32)
    prox_logp_bt = logp_bt if prox_logp_bt is None else jnp.asarray(prox_logp_bt, jnp.float32)
    loss_mask_bt = jnp.ones_like(logp_bt) if loss_mask_bt is None else jnp.asarray(loss_mask_bt, jnp.float32)
    return LossInputs(
        logp_bt=logp_bt,
        prox_logp_bt=prox_logp_bt,
        behav_logp_bt=prox_logp_bt if behav_logp_bt is None else jnp.asarray(behav_logp_bt, jnp.float32),
        advantages_bt=jnp.ones_like(logp_bt)
        if advantages_bt is None
        else jnp.asarray(advantages_bt, jnp.float32),
        loss_mask_bt=loss_mask_bt,
        weight_bt=token_weights_bt(loss_mask_bt, aggregation),
        metric_weight_bt=token_weights_bt(loss_mask_bt, "token_mean"),
        entropy_bt=jnp.zeros_like(logp_bt),
        ref_logp_bt=None if ref_logp_bt is None else jnp.asarray(ref_logp_bt, jnp.float32),
    )


def test_logp_bt_scores_each_token_given_its_prefix() -> None:
    # Position 0 predicts uniformly over 2 tokens; position 1 predicts p = [3/4, 1/4] (logits log 3, 0).
    # An identity unembedding makes the hidden states the logits.
    logits_btv = jnp.array([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, -5.0]]])
    tokens_bt = jnp.array([[1, 1, 0]])
    logp_bt, entropy_bt = token_logp_and_entropy(logits_btv, tokens_bt, jnp.eye(2), softcap=None, chunk_tokens=1)
    np.testing.assert_allclose(logp_bt, [[0.0, math.log(0.5), math.log(0.75)]], rtol=1e-6)
    entropy_34 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    np.testing.assert_allclose(entropy_bt, [[0.0, math.log(2.0), entropy_34]], rtol=1e-6)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_vocabulary_slices_give_the_whole_vocabulary_log_softmax_and_its_gradient(softcap: float | None) -> None:
    # 61 (prime) entries: every slicing but 1 and 61 pads its last slice, whose padding must weigh nothing.
    rng = np.random.default_rng(0)
    h_btd = jnp.asarray(rng.normal(size=(2, 7, 8)), jnp.float32)
    w_vd = jnp.asarray(rng.normal(size=(61, 8)), jnp.float32)
    tokens_bt = jnp.asarray(rng.integers(0, 61, size=(2, 7)))
    c_bt = jnp.asarray(rng.normal(size=(2, 7)), jnp.float32)

    def whole(h_btd: jax.Array, w_vd: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        logp_btv = jax.nn.log_softmax(unembed_logits(h_btd, w_vd, softcap), axis=-1)
        logp_bt = jnp.take_along_axis(logp_btv[:, :-1], tokens_bt[:, 1:, None], axis=-1)[..., 0]
        entropy_bt = -(jnp.exp(logp_btv) * logp_btv).sum(-1)[:, :-1]
        return (c_bt[:, 1:] * logp_bt).sum(), (logp_bt, entropy_bt)

    def sliced(h_btd: jax.Array, w_vd: jax.Array, chunk: int) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        logp_bt, entropy_bt = token_logp_and_entropy(h_btd, tokens_bt, w_vd, softcap=softcap, chunk_tokens=chunk)
        assert (logp_bt[:, 0] == 0).all() and (entropy_bt[:, 0] == 0).all()
        return (c_bt * logp_bt).sum(), (logp_bt[:, 1:], entropy_bt[:, 1:])

    (ref_dh, ref_dw), (ref_logp, ref_entropy) = jax.grad(whole, argnums=(0, 1), has_aux=True)(h_btd, w_vd)
    # 14 tokens: chunk 1 -> 14 slices of 5 (9 padding rows: the last slice is padding only), 3 -> 5 of 13 (4
    # padding rows), 14 -> one slice.
    for chunk in (1, 3, 14):
        (dh, dw), (logp, entropy) = jax.grad(sliced, argnums=(0, 1), has_aux=True)(h_btd, w_vd, chunk)
        np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5, err_msg=f"chunk {chunk}")
        np.testing.assert_allclose(entropy, ref_entropy, rtol=1e-5, atol=1e-5, err_msg=f"chunk {chunk}")
        np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=1e-5, err_msg=f"chunk {chunk}")
        np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=1e-5, err_msg=f"chunk {chunk}")


def test_the_backward_pass_keeps_each_slices_statistics_and_never_its_logits(capsys: pytest.CaptureFixture) -> None:
    # 14 tokens over a 61-entry vocabulary in 5 slices of 13: what the backward pass keeps from the slices' loop
    # is the per-token maximum and sum of exponentials of each slice ([5, 14] each), so it recomputes only the
    # logits and their exponentials, not the two reductions; no [14, 13] logits or [5, 14, 13] stack survives.
    rng = np.random.default_rng(0)
    h_btd = jnp.asarray(rng.normal(size=(2, 7, 8)), jnp.float32)
    w_vd = jnp.asarray(rng.normal(size=(61, 8)), jnp.float32)
    tokens_bt = jnp.asarray(rng.integers(0, 61, size=(2, 7)))
    print_saved_residuals(
        lambda h, w: token_logp_and_entropy(h, tokens_bt, w, softcap=None, chunk_tokens=3)[0].sum(), h_btd, w_vd)
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[0] for line in lines if "output of scan" in line) == ["f32[5,14]", "f32[5,14]"]
    assert not [line for line in lines if ",13]" in line.split()[0]]


def test_the_vocabulary_is_sliced_evenly_when_a_divisor_is_near_enough() -> None:
    assert vocab_chunks(151936, 4) == 4
    assert vocab_chunks(151936, 5) == 8  # 151936 = 2^7 * 1187: no divisor in 5..7
    assert vocab_chunks(61, 14) == 14  # prime: padded slices
    assert vocab_chunks(64, 100) == 64  # never more slices than entries
    assert vocab_chunks(64, 0) == 1


def test_aggregation_weights_match_hand_values() -> None:
    # Row 0 has 3 loss tokens, row 1 has 1, row 2 is padding (no loss token, not a sequence).
    mask_bt = jnp.array([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], jnp.float32)
    np.testing.assert_allclose(token_weights_bt(mask_bt, "token_mean"), mask_bt / 4)
    expected = [[0, 1 / 6, 1 / 6, 1 / 6], [0, 1 / 2, 0, 0], [0, 0, 0, 0]]  # (1/3)/2 and (1/1)/2
    np.testing.assert_allclose(token_weights_bt(mask_bt, "seq_mean_token_mean"), expected, rtol=1e-6)


def test_grpo_clips_known_ratios_and_reports_clip_fractions() -> None:
    # Four on-policy-behaviour tokens (w = 1) with known ratios r = exp(logp - prox):
    #   r=1.5, A=+1 -> clipped at 1 + .28     -> 1.28   (high clip)
    #   r=0.5, A=-1 -> min(-.5, -.8)          -> -0.8   (low clip)
    #   r=1.1, A=+1 -> inside the trust region -> 1.1
    #   r=0.5, A=+1 -> min(.5, .8)            -> 0.5    (unclipped term chosen: not a clip)
    ratios = jnp.array([[1.5, 0.5, 1.1, 0.5]])
    prox_bt = jnp.full((1, 4), -1.0)
    x = make_inputs(prox_bt + jnp.log(ratios), prox_logp_bt=prox_bt, advantages_bt=[[1.0, -1.0, 1.0, 1.0]])
    loss, metrics = get_loss("grpo")(x, CFG)
    np.testing.assert_allclose(loss, -(1.28 - 0.8 + 1.1 + 0.5) / 4, rtol=1e-6)
    np.testing.assert_allclose(metrics.means["clip_frac_low"], 1 / 4)
    np.testing.assert_allclose(metrics.means["clip_frac_high"], 1 / 4)
    np.testing.assert_allclose(metrics.means["ratio_mean"], (1.5 + 0.5 + 1.1 + 0.5) / 4, rtol=1e-6)
    np.testing.assert_allclose(metrics.maxes["ratio_max"], 1.5, rtol=1e-6)

    # d loss / d logp = -w r A / n on unclipped tokens, 0 where the clip is active.
    grad_bt = jax.grad(lambda logp_bt: get_loss("grpo")(x._replace(logp_bt=logp_bt), CFG)[0])(x.logp_bt)
    np.testing.assert_allclose(grad_bt, [[0.0, 0.0, -1.1 / 4, -0.5 / 4]], rtol=1e-5)


def test_behaviour_weight_is_truncated_at_cap() -> None:
    # prox - behav = log 10 -> w = min(10, C=5) = 5; prox - behav = log 0.5 -> w = 0.5. r = 1, A = 1.
    prox_bt = jnp.array([[-2.0, -2.0]])
    behav_bt = prox_bt - jnp.log(jnp.array([[10.0, 0.5]]))
    loss, metrics = get_loss("grpo")(make_inputs(prox_bt, behav_logp_bt=behav_bt), CFG)
    np.testing.assert_allclose(loss, -(5.0 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics.maxes["behav_weight_max"], 5.0, rtol=1e-6)
    np.testing.assert_allclose(metrics.means["behav_weight_mean"], (5.0 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics.means["behav_weight_capped_frac"], 1 / 2)
    np.testing.assert_allclose(
        metrics.means["prox_behav_logp_abs_diff"], (math.log(10) + math.log(2)) / 2, rtol=1e-6
    )


def test_grpo_equals_ordinary_clipped_grpo_when_prox_equals_behaviour() -> None:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    prox_bt = -jax.random.uniform(k1, (3, 6), minval=0.1, maxval=4.0)
    logp_bt = prox_bt + 0.4 * jax.random.normal(k2, (3, 6))
    advantages_bt = jax.random.normal(k3, (3, 1)) * jnp.ones((3, 6))
    x = make_inputs(logp_bt, prox_logp_bt=prox_bt, behav_logp_bt=prox_bt, advantages_bt=advantages_bt)

    @jax.jit
    def ordinary_ppo_clip(logp_bt: jax.Array) -> jax.Array:
        ratio_bt = jnp.exp(logp_bt - prox_bt)
        clipped_bt = jnp.clip(ratio_bt, 0.8, 1.28)
        return -jnp.minimum(ratio_bt * advantages_bt, clipped_bt * advantages_bt).mean()

    @jax.jit
    def ours(logp_bt: jax.Array) -> jax.Array:
        return get_loss("grpo")(x._replace(logp_bt=logp_bt), CFG)[0]

    np.testing.assert_allclose(ours(logp_bt), ordinary_ppo_clip(logp_bt), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(ours)(logp_bt), jax.grad(ordinary_ppo_clip)(logp_bt), rtol=1e-5)


def test_k3_kl_golden_value_and_penalty() -> None:
    # d = ref - logp = log 2 -> k3 = e^d - d - 1 = 2 - log 2 - 1.
    logp_bt = jnp.array([[-1.0, -1.0]])
    ref_bt = logp_bt + jnp.array([[math.log(2.0), 0.0]])
    np.testing.assert_allclose(k3_kl_bt(logp_bt, ref_bt), [[1 - math.log(2.0), 0.0]], atol=1e-7)
    cfg = LossConfig(kl_coef=0.1)
    loss, metrics = get_loss("grpo")(make_inputs(logp_bt, ref_logp_bt=ref_bt), cfg)
    # On-policy, A = 1, r = w = 1: surrogate 1 per token; the KL mean is (1 - log 2) / 2.
    np.testing.assert_allclose(metrics.means["kl"], (1 - math.log(2.0)) / 2, rtol=1e-6)
    np.testing.assert_allclose(loss, -1.0 + 0.1 * (1 - math.log(2.0)) / 2, rtol=1e-6)


def test_nll_is_the_mean_negative_logp_of_loss_tokens() -> None:
    x = make_inputs([[-9.0, -1.0, -3.0]], loss_mask_bt=[[0, 1, 1]])
    loss, metrics = get_loss("nll")(x, LossConfig(name="nll"))
    np.testing.assert_allclose(loss, (1.0 + 3.0) / 2)
    np.testing.assert_allclose(metrics.means["nll"], (1.0 + 3.0) / 2)


@pytest.mark.parametrize("loss_name", ["grpo", "nll"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_padding_is_masked_out_even_with_extreme_values(loss_name: str, aggregation: str) -> None:
    cfg = LossConfig(name=loss_name, aggregation=aggregation, kl_coef=0.05)
    logp_bt = jnp.array([[-1.0, -0.5, -2.0]])
    base = make_inputs(
        logp_bt,
        prox_logp_bt=logp_bt - 0.3,
        advantages_bt=[[0.7] * 3],
        ref_logp_bt=logp_bt - 0.1,
        aggregation=aggregation,
    )

    # Append 2 padded columns and 1 padded row full of values that would overflow exp() if used.
    def pad(a_bt: jax.Array, value: float) -> jax.Array:
        return jnp.pad(
            jnp.pad(a_bt, ((0, 0), (0, 2)), constant_values=value), ((0, 1), (0, 0)), constant_values=value
        )

    mask_bt = pad(jnp.ones((1, 3)), 0.0)
    padded = make_inputs(
        pad(logp_bt, -500.0),
        prox_logp_bt=pad(base.prox_logp_bt, 300.0),
        behav_logp_bt=pad(base.behav_logp_bt, -400.0),
        advantages_bt=pad(base.advantages_bt, 1e6),
        loss_mask_bt=mask_bt,
        ref_logp_bt=pad(base.ref_logp_bt, 200.0),
        aggregation=aggregation,
    )

    @jax.jit
    def value_and_grad(x: LossInputs):
        return jax.value_and_grad(lambda lp: get_loss(loss_name)(x._replace(logp_bt=lp), cfg), has_aux=True)(
            x.logp_bt
        )

    (loss, metrics), grad_bt = value_and_grad(base)
    (padded_loss, padded_metrics), padded_grad_bt = value_and_grad(padded)
    np.testing.assert_allclose(padded_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(padded_grad_bt[:1, :3], grad_bt, rtol=1e-6)
    assert np.all(padded_grad_bt[:, 3:] == 0) and np.all(padded_grad_bt[1:] == 0)
    for key, value in metrics.means.items():
        np.testing.assert_allclose(padded_metrics.means[key], value, rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("n_micro", [2, 4])
def test_micro_batch_losses_sum_to_the_full_batch_loss(aggregation: str, n_micro: int) -> None:
    # Rows with very different loss-token counts, so a per-micro-batch normaliser would be wrong.
    keys = jax.random.split(jax.random.key(1), 4)
    lengths_b = jnp.array([1, 7, 3, 8, 2, 5, 6, 4])
    mask_bt = (jnp.arange(8)[None, :] < lengths_b[:, None]).astype(jnp.float32)
    prox_bt = -jax.random.uniform(keys[0], (8, 8), minval=0.1, maxval=3.0)
    x = make_inputs(
        prox_bt + 0.3 * jax.random.normal(keys[1], (8, 8)),
        prox_logp_bt=prox_bt,
        behav_logp_bt=prox_bt + 0.2 * jax.random.normal(keys[2], (8, 8)),
        advantages_bt=jax.random.normal(keys[3], (8, 1)) * jnp.ones((8, 8)),
        loss_mask_bt=mask_bt,
        aggregation=aggregation,
    )
    loss_and_grad = jax.jit(
        jax.value_and_grad(lambda lp, x: get_loss("grpo")(x._replace(logp_bt=lp), CFG), has_aux=True)
    )
    (full_loss, full_metrics), full_grad_bt = loss_and_grad(x.logp_bt, x)

    rows = 8 // n_micro
    micro_loss, micro_clip, micro_ratio_max, micro_grads = 0.0, 0.0, 0.0, []
    for i in range(n_micro):
        micro = jax.tree.map(lambda a, i=i: a[i * rows : (i + 1) * rows], x)  # weights sliced, not recomputed
        (loss, metrics), grad_bt = loss_and_grad(micro.logp_bt, micro)
        micro_loss += loss
        micro_clip += metrics.means["clip_frac_low"] + metrics.means["clip_frac_high"]
        micro_ratio_max = max(micro_ratio_max, float(metrics.maxes["ratio_max"]))
        micro_grads.append(grad_bt)
    np.testing.assert_allclose(micro_loss, full_loss, rtol=1e-6)
    np.testing.assert_allclose(jnp.concatenate(micro_grads), full_grad_bt, rtol=1e-6)
    full_clip = full_metrics.means["clip_frac_low"] + full_metrics.means["clip_frac_high"]
    np.testing.assert_allclose(micro_clip, full_clip, rtol=1e-6)
    assert micro_ratio_max == float(full_metrics.maxes["ratio_max"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "ppo"}, r"'ppo'; choose one of \['grpo', 'nll'\]"),
        ({"aggregation": "seq_sum"}, r"'seq_sum'; choose one of \['seq_mean_token_mean', 'token_mean'\]"),
        ({"eps_low": 1.0}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"behav_weight_cap": 0.0}, "behav_weight_cap"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"correction": "ppo"}, r"'ppo'; choose one of \['geo_mask', 'icepop', 'mis', 'none', 'tis'\]"),
        ({"mask_low": 1.5}, "mask_low"),
        ({"mask_high": 0.9}, "mask_high"),
    ],
)
def test_loss_config_rejects_bad_values_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_masked_quantile_is_the_nearest_rank_over_masked_in_tokens() -> None:
    from pipelines_lib.train.losses import masked_quantile

    x_bt = jnp.asarray([[5.0, 1.0, 9.0, 3.0], [2.0, 100.0, 4.0, 0.0]])
    mask_bt = jnp.asarray([[1, 1, 0, 1], [1, 0, 1, 1]])  # valid: 5 1 3 2 4 0 -> sorted 0 1 2 3 4 5
    assert float(masked_quantile(x_bt, mask_bt, 0.99)) == 5.0  # ceil(0.99 * 6) = 6th smallest
    assert float(masked_quantile(x_bt, mask_bt, 0.5)) == 2.0  # ceil(3) = 3rd smallest
    assert float(masked_quantile(x_bt, jnp.zeros_like(mask_bt), 0.99)) == 0.0


# Ratios ρ = π_prox / π_behav of four tokens in one row, and the band / cap the corrections use below.
RHO_T = [8.0, 0.25, 1.5, 1.0]
BAND_CFG = LossConfig(behav_weight_cap=4.0, mask_low=0.5, mask_high=2.0)


def correction_of(name: str, rho_bt, mask_bt=None) -> tuple[np.ndarray, np.ndarray]:
    log_rho_bt = jnp.log(jnp.asarray(rho_bt, jnp.float32))
    mask_bt = jnp.ones_like(log_rho_bt) if mask_bt is None else jnp.asarray(mask_bt, jnp.float32)
    weight_bt, flagged_bt = CORRECTIONS[name](log_rho_bt, mask_bt, BAND_CFG)
    return np.asarray(weight_bt), np.asarray(flagged_bt)


@pytest.mark.parametrize(
    ("name", "weights", "flagged"),
    [
        # TIS: min(ρ, C=4) -> 8 is capped at 4, the rest pass.
        ("tis", [4.0, 0.25, 1.5, 1.0], [1, 0, 0, 0]),
        # MIS: ρ·1[ρ <= 4] -> 8 is masked (0), the low ratio keeps its 0.25.
        ("mis", [0.0, 0.25, 1.5, 1.0], [1, 0, 0, 0]),
        # IcePop: ρ·1[0.5 <= ρ <= 2] -> both tails (8 and 0.25) are masked.
        ("icepop", [0.0, 0.0, 1.5, 1.0], [1, 1, 0, 0]),
        ("none", [1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]),
    ],
)
def test_token_corrections_weight_and_flag_known_ratios(name: str, weights: list, flagged: list) -> None:
    weight_bt, flagged_bt = correction_of(name, [RHO_T])
    np.testing.assert_allclose(weight_bt, [weights], rtol=1e-6)
    np.testing.assert_array_equal(flagged_bt, [flagged])


def test_geo_mask_drops_whole_sequences_whose_geometric_mean_ratio_leaves_the_band() -> None:
    # Row 0: geometric mean of (8, 0.25, 1.5, 1.0) = (3)^(1/4) = 1.316 -> kept, TIS weights (8 capped at 4).
    # Row 1: (4, 4, 1, pad 100): only the three loss tokens count -> 16^(1/3) = 2.52 > 2 -> the row is dropped.
    weight_bt, flagged_bt = correction_of("geo_mask", [RHO_T, [4.0, 4.0, 1.0, 100.0]], [[1, 1, 1, 1], [1, 1, 1, 0]])
    np.testing.assert_allclose(weight_bt, [[4.0, 0.25, 1.5, 1.0], [0.0, 0.0, 0.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(flagged_bt, [[0, 0, 0, 0], [1, 1, 1, 0]])


def test_grpo_applies_the_configured_correction_and_reports_every_corrections_share() -> None:
    # r = 1, A = 1: each token's surrogate is its weight, so the loss is minus the mean IcePop weight.
    prox_bt = jnp.full((1, 4), -1.0)
    behav_bt = prox_bt - jnp.log(jnp.asarray([RHO_T]))
    x = make_inputs(prox_bt, behav_logp_bt=behav_bt)
    loss, metrics = get_loss("grpo")(x, dataclasses.replace(BAND_CFG, correction="icepop"))
    np.testing.assert_allclose(loss, -(1.5 + 1.0) / 4, rtol=1e-6)
    assert float(metrics.means["behav_weight_capped_frac"]) == pytest.approx(2 / 4)
    shares = {name: float(metrics.means[f"correction_frac_{name}"]) for name in CORRECTIONS}
    assert shares == pytest.approx({"tis": 1 / 4, "mis": 1 / 4, "icepop": 2 / 4, "geo_mask": 0.0, "none": 0.0})
    # |log ρ| mean and KL(π_behav ‖ π_prox) by k3 = ρ − log ρ − 1 per token, averaged.
    logs = [math.log(r) for r in RHO_T]
    np.testing.assert_allclose(metrics.means["prox_behav_logp_abs_diff"], sum(map(abs, logs)) / 4, rtol=1e-6)
    k3 = [r - math.log(r) - 1 for r in RHO_T]  # 8 - 2.079 - 1 = 4.921, 0.25 + 1.386 - 1 = 0.636, 0.0945, 0
    np.testing.assert_allclose(metrics.means["behav_prox_kl"], sum(k3) / 4, rtol=1e-5)
