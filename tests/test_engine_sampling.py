"""Sampling filters and per-request keys, with numbers checkable by hand."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipelines_lib.engine.sampling import (
    DRAWS,
    default_draw,
    draw,
    filtered_logits,
    gumbel,
    request_keys,
    sample,
)

NEG = -np.inf


@jax.jit
def _filtered(logits_bv, temperature_b, top_k_b, top_p_b):
    return filtered_logits(logits_bv, temperature_b, top_k_b, top_p_b)


def filt(logits: list[float], *, t: float = 1.0, k: int = 0, p: float = 1.0) -> np.ndarray:
    out = _filtered(jnp.asarray([logits], jnp.float32), jnp.asarray([t]), jnp.asarray([k]), jnp.asarray([p]))
    return np.asarray(out[0])


def test_top_k_keeps_the_k_best() -> None:
    np.testing.assert_array_equal(filt([1.0, 4.0, 2.0, 3.0], k=2), [NEG, 4.0, NEG, 3.0])
    np.testing.assert_array_equal(filt([1.0, 4.0, 2.0, 3.0], k=0), [1.0, 4.0, 2.0, 3.0])
    np.testing.assert_array_equal(filt([1.0, 4.0], k=9), [1.0, 4.0])


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    logits = np.log([0.5, 0.3, 0.15, 0.05]).tolist()
    # mass before each token: 0, 0.5, 0.8, 0.95 -> p=0.6 keeps the first two, p=0.5 only the first.
    assert np.isfinite(filt(logits, p=0.6)).tolist() == [True, True, False, False]
    assert np.isfinite(filt(logits, p=0.5)).tolist() == [True, False, False, False]
    assert np.isfinite(filt(logits, p=0.81)).tolist() == [True, True, True, False]


def test_temperature_scales_before_filtering() -> None:
    np.testing.assert_allclose(filt([2.0, 4.0], t=0.5), [4.0, 8.0])
    # T=2 turns probabilities [0.5, 0.3, 0.15, 0.05] into sqrt-proportional [0.38, 0.29, 0.21, 0.12]:
    # mass before each token 0, 0.38, 0.67 -> p=0.7 keeps three tokens (at T=1: 0, 0.5, 0.8 -> two).
    logits = np.log([0.5, 0.3, 0.15, 0.05]).tolist()
    assert np.isfinite(filt(logits, t=2.0, p=0.7)).sum() == 3
    assert np.isfinite(filt(logits, p=0.7)).sum() == 2


def test_greedy_rows_take_argmax_with_plain_log_softmax() -> None:
    logits = jnp.asarray([[0.0, 2.0, 1.0]], jnp.float32)
    token, logprob = jax.jit(sample)(
        logits,
        jnp.asarray([0.0]),
        jnp.asarray([1]),
        jnp.asarray([0.1]),
        request_keys(jnp.asarray([0], jnp.uint32), jnp.asarray([0])),
    )
    assert int(token[0]) == 1
    # top-k/top-p are ignored for greedy: log softmax of the raw logits, 2 - log(1 + e^2 + e).
    np.testing.assert_allclose(float(logprob[0]), 2.0 - np.log(1 + np.e**2 + np.e), rtol=1e-6)


def test_sampled_logprob_is_under_the_renormalised_filtered_distribution() -> None:
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]], jnp.float32))
    keys = request_keys(jnp.asarray([7], jnp.uint32), jnp.asarray([3]))
    token, logprob = jax.jit(sample)(logits, jnp.asarray([1.0]), jnp.asarray([0]), jnp.asarray([0.6]), keys)
    assert int(token[0]) in (0, 1)
    expected = {0: np.log(0.5 / 0.8), 1: np.log(0.3 / 0.8)}[int(token[0])]
    np.testing.assert_allclose(float(logprob[0]), expected, rtol=1e-5)


def test_keys_depend_only_on_seed_and_index() -> None:
    keys = jax.random.key_data(request_keys(jnp.asarray([1, 2, 1], jnp.uint32), jnp.asarray([5, 5, 5])))
    np.testing.assert_array_equal(keys[0], keys[2])
    assert not np.array_equal(keys[0], keys[1])
    shifted = jax.random.key_data(request_keys(jnp.asarray([1], jnp.uint32), jnp.asarray([6])))
    assert not np.array_equal(keys[0], shifted[0])


def _sorted_reference(z: np.ndarray, k: int, p: float) -> np.ndarray:
    """The filter's definition spelled out with a full sort (float64), one row."""
    order = np.argsort(-z, kind="stable")
    keep_k = z >= z[order[min(k, len(z)) - 1]] if k else np.ones(len(z), bool)
    kept = np.where(keep_k, z, -np.inf)
    probs = np.exp(kept - kept.max())
    probs /= probs.sum()
    ranked = probs[order]
    n_keep = int(np.sum((np.cumsum(ranked) - ranked < p) & keep_k[order]))
    return np.where(keep_k & (z >= z[order[n_keep - 1]]), z, -np.inf)


def test_search_without_sort_matches_the_sorted_definition_on_a_large_vocabulary() -> None:
    rng = np.random.default_rng(0)
    vocab = 5000
    z = rng.normal(size=(6, vocab)).astype(np.float32)
    z[1, :50] = z[1, 0]  # a tie across the top-k threshold
    ks, ps = [0, 1, 40, 0, 7, 4999], [0.9, 1.0, 0.5, 0.3, 0.99, 1.0]
    got = np.asarray(_filtered(jnp.asarray(z), jnp.ones(6), jnp.asarray(ks), jnp.asarray(ps, np.float32)))
    for row in range(6):
        np.testing.assert_array_equal(np.isfinite(got[row]), np.isfinite(_sorted_reference(z[row], ks[row], ps[row])))


def test_rows_without_filters_draw_from_the_plain_scaled_logits() -> None:
    out = _filtered(jnp.asarray([[1.0, 4.0, 2.0]]), jnp.asarray([2.0]), jnp.asarray([0]), jnp.asarray([1.0]))
    np.testing.assert_array_equal(np.asarray(out), [[0.5, 2.0, 1.0]])


def _draws(weights: list[float], n: int, chunk: int) -> np.ndarray:
    keys = request_keys(jnp.zeros(n, jnp.uint32), jnp.arange(n))
    z_bv = jnp.broadcast_to(jnp.log(jnp.asarray(weights, jnp.float32)), (n, len(weights)))
    tokens, total = jax.jit(draw, static_argnums=3)(keys, z_bv, jnp.max(z_bv, axis=-1), chunk)
    np.testing.assert_allclose(np.asarray(total), sum(weights) / max(weights), rtol=1e-6)
    return np.asarray(tokens)


def test_draws_follow_the_weights_across_chunks() -> None:
    # Chunks of 2 over 5 entries (the last chunk padded): both levels of the inverse CDF are exercised.
    weights = [0.4, 0.1, 0.25, 0.05, 0.2]
    counts = np.bincount(_draws(weights, 20_000, chunk=2), minlength=5) / 20_000
    # 20,000 draws: a frequency's standard deviation is at most 0.0036, so 0.015 is over four of them.
    np.testing.assert_allclose(counts, weights, atol=0.015)


def test_zero_weight_entries_are_never_drawn() -> None:
    weights = [0.0, 3.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    drawn = _draws(weights, 5_000, chunk=3)
    assert set(drawn.tolist()) == {1, 4}


def _sampled(logits: list[float], n: int, draw_by: str) -> tuple[np.ndarray, np.ndarray]:
    """``n`` tokens sampled at temperature 1 from one row of logits, each with its own key, and their log-probs."""
    keys = request_keys(jnp.zeros(n, jnp.uint32), jnp.arange(n))
    logits_bv = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, len(logits)))
    tokens, logprobs = jax.jit(functools.partial(sample, draw_by=draw_by))(
        logits_bv, jnp.ones(n), jnp.zeros(n, jnp.int32), jnp.ones(n), keys)
    return np.asarray(tokens), np.asarray(logprobs)


@pytest.mark.parametrize("draw_by", DRAWS)
def test_either_draw_follows_the_weights_and_never_draws_a_removed_entry(draw_by: str) -> None:
    weights = [0.4, 0.1, 0.25, 0.05, 0.2]
    tokens, logprobs = _sampled(np.log(weights).tolist(), 20_000, draw_by)
    # 20,000 draws: a frequency's standard deviation is at most 0.0036, so 0.015 is over four of them.
    np.testing.assert_allclose(np.bincount(tokens, minlength=5) / 20_000, weights, atol=0.015)
    np.testing.assert_allclose(logprobs, np.log(weights)[tokens], rtol=1e-5)
    tokens, _ = _sampled([NEG, np.log(3.0), NEG, NEG, 0.0, NEG, NEG, NEG], 5_000, draw_by)
    assert set(tokens.tolist()) == {1, 4}


@pytest.mark.parametrize("draw_by", DRAWS)
def test_either_draw_over_a_large_vocabulary_has_the_distributions_mean_log_probability(draw_by: str) -> None:
    # An exact sampler's mean log p(x) is -H(p); its draws' mean differs from it by noise of std(log p) / sqrt(n).
    # A vocabulary of 50,000 whose logits spread like a model's (normal, sd 3), so that the winning noise values
    # come from the far tail of the uniform, where a sampler that loses precision goes wrong.
    logits = np.random.default_rng(1).normal(0.0, 3.0, 50_000)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    log_p = np.log(p)
    tokens, logprobs = _sampled(logits.tolist(), 4_000, draw_by)
    np.testing.assert_allclose(logprobs, log_p[tokens], atol=2e-4)
    mean, sd = float(np.sum(p * log_p)), float(np.sqrt(np.sum(p * (log_p - np.sum(p * log_p)) ** 2)))
    assert abs(logprobs.mean() - mean) < 4 * sd / np.sqrt(4_000), (logprobs.mean(), mean, sd)


def test_gumbel_noise_depends_only_on_the_rows_key_and_the_entry() -> None:
    keys = request_keys(jnp.asarray([3, 4, 3], jnp.uint32), jnp.asarray([0, 0, 0]))
    g = np.asarray(gumbel(keys, 6))
    np.testing.assert_array_equal(g[0], g[2])
    assert not np.array_equal(g[0], g[1]) and len(set(g[0].tolist())) == 6
    np.testing.assert_array_equal(np.asarray(gumbel(keys[:1], 9))[0, :6], g[0])  # the vocabulary's size aside


def test_an_unknown_draw_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="draw_by must be one of"):
        _sampled([0.0, 1.0], 1, "sorted")


def test_sample_draws_by_default_as_default_draw_names_the_inverse_cdf_on_a_cpu() -> None:
    logits = np.random.default_rng(2).normal(0.0, 2.0, 64).tolist()
    keys = request_keys(jnp.zeros(256, jnp.uint32), jnp.arange(256))
    args = (jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (256, 64)), jnp.ones(256), jnp.zeros(256, jnp.int32),
            jnp.ones(256), keys)
    by_default = np.asarray(jax.jit(sample)(*args)[0])
    np.testing.assert_array_equal(by_default, _sampled(logits, 256, default_draw())[0])
    assert not np.array_equal(by_default, _sampled(logits, 256, *(set(DRAWS) - {default_draw()}))[0])
    if jax.default_backend() == "cpu":  # measured: there the noise's logarithms cost twice the CDF's passes
        assert default_draw() == "cdf"
