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
    ``mass{z >= t} >= p``, both exact. When no row filters, the search is skipped altogether. Only the
    per-row threshold comes out of that branch: a ``[rows, vocab]`` result of a ``cond`` is a buffer of its
    own, while an elementwise one can be fused into the passes that read it.
    """
    scaled_bv = logits_bv / jnp.where(temperature_b > 0, temperature_b, 1.0)[:, None]
    keys_bv = _ordered_keys(scaled_bv)

    def threshold() -> jax.Array:
        k_b = jnp.where(top_k_b > 0, top_k_b, scaled_bv.shape[-1])[:, None]
        kth_b = _largest_key(keys_bv, lambda t_b: jnp.sum(keys_bv >= t_b[:, None], axis=-1) >= k_b[:, 0])
        probs_bv = jax.nn.softmax(jnp.where(keys_bv >= kth_b[:, None], scaled_bv, -jnp.inf), axis=-1)
        cut_b = _largest_key(
            keys_bv, lambda t_b: jnp.sum(jnp.where(keys_bv >= t_b[:, None], probs_bv, 0.0), axis=-1) >= top_p_b
        )
        return jnp.maximum(kth_b, cut_b)

    filtering = jnp.any(((top_k_b > 0) | (top_p_b < 1.0)) & (temperature_b > 0))
    keep_b = jax.lax.cond(filtering, threshold, lambda: jnp.zeros(keys_bv.shape[0], jnp.uint32))
    return jnp.where(keys_bv >= keep_b[:, None], scaled_bv, -jnp.inf)


def draw(key_b: jax.Array, z_bv: jax.Array, max_b: jax.Array, chunk: int = 256) -> tuple[jax.Array, jax.Array]:
    """Per row, index ``i`` drawn with probability ``exp(z_bv[i] - max_b) / total_b``, and ``total_b = Σ exp(z_bv -
    max_b)`` (``max_b`` at least every finite ``z``, one finite entry at least), by inverting the cumulative sum at
    one uniform draw per row: find the chunk of ``chunk`` entries whose cumulative mass crosses the draw, then the
    entry inside it. One random number per row instead of one per vocabulary entry (a Gumbel draw), which dominated
    sampling on CPU. The chosen chunk's weights are recomputed from its ``chunk`` entries, so no weight array
    over the vocabulary is kept between passes. A ``-inf`` entry is never drawn; rounding at a boundary falls
    back to the last positive entry."""
    b, v = z_bv.shape
    n = -(-v // chunk)
    z_bnc = jnp.pad(z_bv, ((0, 0), (0, n * chunk - v)), constant_values=-jnp.inf).reshape(b, n, chunk)
    mass_bn = jnp.sum(jnp.exp(z_bnc - max_b[:, None, None]), axis=-1)
    cdf_bn = jnp.cumsum(mass_bn, axis=-1)
    target_b = jax.vmap(jax.random.uniform)(key_b) * cdf_bn[:, -1]

    def last_positive(x_bk: jax.Array) -> jax.Array:
        return x_bk.shape[-1] - 1 - jnp.argmax(x_bk[:, ::-1] > 0, axis=-1)

    c_b = jnp.minimum(jnp.sum(cdf_bn <= target_b[:, None], axis=-1), last_positive(mass_bn))
    within_b = target_b - jnp.take_along_axis(cdf_bn - mass_bn, c_b[:, None], axis=-1)[:, 0]
    w_bc = jnp.exp(jnp.take_along_axis(z_bnc, c_b[:, None, None], axis=1)[:, 0] - max_b[:, None])
    i_b = jnp.minimum(jnp.sum(jnp.cumsum(w_bc, axis=-1) <= within_b[:, None], axis=-1), last_positive(w_bc))
    return c_b * chunk + i_b, cdf_bn[:, -1]


def _mix(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: every input bit flips each output bit with probability about 1/2."""
    x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
    x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def gumbel(key_b: jax.Array, vocab: int) -> jax.Array:
    """``[rows, vocab]`` standard Gumbel variates, row ``b``'s a function of ``key_b[b]`` and the entry's index only.

    One generator call per row (32 bits of its key), then per entry a counter hash (``_mix`` over the row's bits plus
    the index times the golden ratio, a Weyl sequence) made a uniform ``w`` on (0, 1) with float32's relative precision
    down to 2^-33, and ``-log(-log(1 - w))``. The largest variates, the ones that win an argmax, come from the smallest
    ``w``: there ``-log(1 - w)`` is taken from its series (``1 - w`` would round it away), so they keep their
    precision. The support is about [-2.8, 22.9]: the 6e-8 of probability below is cut, and the top 2e-10 above
    22.2 is lumped at the largest value."""
    base_b = jax.vmap(lambda k: jax.random.bits(k, (), jnp.uint32))(key_b)
    index_v = jax.lax.broadcasted_iota(jnp.uint32, (1, vocab), 1)
    bits_bv = _mix(base_b[:, None] + index_v * jnp.uint32(0x9E3779B9))
    w_bv = jnp.minimum(bits_bv.astype(jnp.float32) * 2.0**-32 + 2.0**-33, 1.0 - 2.0**-24)
    exp_bv = jnp.where(w_bv < 2.0**-10, w_bv * (1.0 + w_bv * (0.5 + w_bv / 3.0)), -jnp.log(1.0 - w_bv))
    return -jnp.log(exp_bv)


DRAWS = ("cdf", "gumbel")
"""How ``sample`` draws a row's token: ``cdf`` inverts the cumulative mass at one uniform a row (``draw``), ``gumbel``
takes ``argmax(z + g)`` over noise from ``gumbel``, one hashed uniform an entry."""


def default_draw() -> str:
    """The draw cheapest on JAX's default backend as measured: on a CPU ``cdf`` (there the noise's two logarithms an
    entry cost twice the inverse CDF's passes), on an accelerator ``gumbel`` (on a TPU v5e the passes cost more than
    the noise; docs/TPU_PERF.md; a GPU takes it too, unmeasured)."""
    return "cdf" if jax.default_backend() == "cpu" else "gumbel"


def sample(
    logits_bv: jax.Array,
    temperature_b: jax.Array,
    top_k_b: jax.Array,
    top_p_b: jax.Array,
    key_b: jax.Array,
    *,
    draw_by: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(token_b, logprob_b).

    Sampled rows draw from ``filtered_logits`` (``draw_by``: one of ``DRAWS``, default ``default_draw()``; both are
    exact) and report the log-probability of the drawn token under that same filtered, temperature-scaled distribution
    (the behaviour policy actually used). Greedy rows (``T == 0``) take the argmax and report its plain
    ``log_softmax(logits)`` value: ``log p(x) = z_x - max z - log Σ exp(z - max z)``. With ``cdf`` the argmax gives
    the maximum and the draw's chunk masses sum to the normaliser; with ``gumbel`` (the argmax of logits plus
    independent standard Gumbel noise is distributed as ``softmax(z)``) the draw, the maximum and the sum are
    reductions over the same elementwise values. Either way no pass over the vocabulary is spent on anything else: at
    Qwen3's vocabulary on a TPU those passes cost as much as the unembedding's matmul (docs/TPU_PERF.md).
    """
    draw_by = draw_by or default_draw()
    if draw_by not in DRAWS:
        raise ValueError(f"sample: draw_by must be one of {DRAWS}, got {draw_by!r}")
    greedy_b = temperature_b == 0
    z_bv = jnp.where(greedy_b[:, None], logits_bv, filtered_logits(logits_bv, temperature_b, top_k_b, top_p_b))
    if draw_by == "gumbel":
        token_b = jnp.argmax(jnp.where(greedy_b[:, None], z_bv, z_bv + gumbel(key_b, z_bv.shape[-1])), axis=-1)
        max_b = jnp.max(z_bv, axis=-1)
        total_b = jnp.sum(jnp.exp(z_bv - max_b[:, None]), axis=-1)
    else:
        best_b = jnp.argmax(z_bv, axis=-1)
        max_b = jnp.take_along_axis(z_bv, best_b[:, None], axis=-1)[:, 0]
        drawn_b, total_b = draw(key_b, z_bv, max_b)
        token_b = jnp.where(greedy_b, best_b, drawn_b)
    z_b = jnp.take_along_axis(z_bv, token_b[:, None], axis=-1)[:, 0]
    logprob_b = z_b - max_b - jnp.log(total_b)
    return token_b.astype(jnp.int32), logprob_b
