"""Per-row token sampling (pure, jit-able): temperature, top-k, top-p, greedy, per-request PRNG keys.

Every row carries its own parameters, so one compiled step serves a batch of requests with different
sampling settings, and its own key ``fold_in(fold_in(key(0), seed), token_index)``, so a request's
draws depend only on its seed and position, never on what else is in the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def request_keys(seed_b: jax.Array, token_index_b: jax.Array) -> jax.Array:
    """One PRNG key per row from the request seed (uint32) and the completion token index."""
    base = jax.random.key(0)
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.fold_in(base, s), i))(seed_b, token_index_b)


def filtered_logits(
    logits_bv: jax.Array, temperature_b: jax.Array, top_k_b: jax.Array, top_p_b: jax.Array
) -> jax.Array:
    """Logits of the distribution a sampled row draws from: ``z / T``, then top-k, then top-p.

    top-k keeps tokens scoring at least the k-th best (``k == 0`` keeps all); top-p then keeps the
    smallest prefix of the remaining tokens, most likely first, whose probability mass reaches ``p``
    (the token crossing ``p`` is kept). Removed tokens get ``-inf``. Ties at a threshold are all kept.
    Rows with ``T == 0`` are scaled by 1 (the caller takes their argmax).
    """
    vocab = logits_bv.shape[-1]
    scaled_bv = logits_bv / jnp.where(temperature_b > 0, temperature_b, 1.0)[:, None]
    sorted_bv = jnp.flip(jnp.sort(scaled_bv, axis=-1), axis=-1)
    k_b = jnp.where(top_k_b > 0, jnp.minimum(top_k_b, vocab), vocab)
    rank_v = jnp.arange(vocab)
    sorted_bv = jnp.where(rank_v[None, :] < k_b[:, None], sorted_bv, -jnp.inf)
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    n_keep_b = jnp.sum((mass_before_bv < top_p_b[:, None]) & (rank_v[None, :] < k_b[:, None]), axis=-1)
    threshold_b = jnp.take_along_axis(sorted_bv, (n_keep_b - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(scaled_bv >= threshold_b[:, None], scaled_bv, -jnp.inf)


def sample(
    logits_bv: jax.Array,
    temperature_b: jax.Array,
    top_k_b: jax.Array,
    top_p_b: jax.Array,
    key_b: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """(token_b, logprob_b).

    Sampled rows draw from ``filtered_logits`` and report the log-probability of the drawn token under
    that same filtered, temperature-scaled distribution (the behaviour policy actually used). Greedy
    rows (``T == 0``) take the argmax and report its plain ``log_softmax(logits)`` value.
    """
    filtered_bv = filtered_logits(logits_bv, temperature_b, top_k_b, top_p_b)
    drawn_b = jax.vmap(jax.random.categorical)(key_b, filtered_bv)
    greedy_b = temperature_b == 0
    token_b = jnp.where(greedy_b, jnp.argmax(logits_bv, axis=-1), drawn_b)
    logp_bv = jnp.where(greedy_b[:, None], jax.nn.log_softmax(logits_bv), jax.nn.log_softmax(filtered_bv))
    logprob_b = jnp.take_along_axis(logp_bv, token_b[:, None], axis=-1)[:, 0]
    return token_b.astype(jnp.int32), logprob_b
