"""Per-row token sampling (pure, jit-able): temperature, top-k, top-p, greedy, per-request PRNG keys.

Every row carries its own parameters, so one compiled step serves a batch of requests with different
sampling settings, and its own key ``fold_in(fold_in(key(0), seed), token_index)``, so a request's
draws depend only on its seed and position, never on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def request_keys(seed_b: jax.Array, token_index_b: jax.Array) -> jax.Array:
    """One PRNG key per row from the request seed (uint32) and the completion token index."""
    base = jax.random.key(0)
    return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.fold_in(base, s), i))(seed_b, token_index_b)


def _ordered_keys(x_bv: jax.Array) -> jax.Array:
    """uint32 keys ordered as the float32 values are (sign bit flipped for positives, all bits for negatives)."""
    bits_bv = jax.lax.bitcast_convert_type(x_bv.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits_bv >> 31 == 1, ~bits_bv, bits_bv | jnp.uint32(0x80000000))


def _largest_key(keys_bv: jax.Array, holds: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Per row, the largest uint32 ``t`` with ``holds(t)`` (monotone: true up to some key, false after), built
    bit by bit from the top: 32 passes over the vocabulary instead of a sort. ``holds(0)`` is taken as true."""

    def step(i: jax.Array, t_b: jax.Array) -> jax.Array:
        candidate_b = t_b | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        return jnp.where(holds(candidate_b), candidate_b, t_b)

    return jax.lax.fori_loop(0, 32, step, jnp.zeros(keys_bv.shape[0], jnp.uint32))


def filtered_logits(
    logits_bv: jax.Array, temperature_b: jax.Array, top_k_b: jax.Array, top_p_b: jax.Array
) -> jax.Array:
    """Logits of the distribution a sampled row draws from: ``z / T``, then top-k, then top-p.

    top-k keeps tokens scoring at least the k-th best (``k == 0`` keeps all); top-p then keeps the
    smallest prefix of the remaining tokens, most likely first, whose probability mass reaches ``p``
    (the token crossing ``p`` is kept). Removed tokens get ``-inf``. Ties at a threshold are all kept.
    Rows with ``T == 0`` are scaled by 1 (the caller takes their argmax).

    No sort: each threshold is found by a bitwise search over the float keys (``_largest_key``), the
    k-th best as the largest ``t`` with ``#{z >= t} >= k`` and the top-p cut as the largest ``t`` with
    ``mass{z >= t} >= p``, both exact. When no row filters, the search is skipped altogether.
    """
    scaled_bv = logits_bv / jnp.where(temperature_b > 0, temperature_b, 1.0)[:, None]

    def cut(scaled_bv: jax.Array) -> jax.Array:
        keys_bv = _ordered_keys(scaled_bv)
        k_b = jnp.where(top_k_b > 0, top_k_b, scaled_bv.shape[-1])[:, None]
        kth_b = _largest_key(keys_bv, lambda t_b: jnp.sum(keys_bv >= t_b[:, None], axis=-1) >= k_b[:, 0])
        top_k_bv = jnp.where(keys_bv >= kth_b[:, None], scaled_bv, -jnp.inf)
        probs_bv = jax.nn.softmax(top_k_bv, axis=-1)
        cut_b = _largest_key(
            keys_bv, lambda t_b: jnp.sum(jnp.where(keys_bv >= t_b[:, None], probs_bv, 0.0), axis=-1) >= top_p_b
        )
        return jnp.where(keys_bv >= jnp.maximum(kth_b, cut_b)[:, None], scaled_bv, -jnp.inf)

    filtering = jnp.any(((top_k_b > 0) | (top_p_b < 1.0)) & (temperature_b > 0))
    return jax.lax.cond(filtering, cut, lambda x: x, scaled_bv)


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
