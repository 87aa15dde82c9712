"""Group-relative advantage estimators (pure ``jnp``, jit-able) and their registry.

Every estimator maps the rewards of whole GRPO groups, ``rewards_gk: float[n_groups, group_size]``,
to one advantage per sample, ``advantages_gk``, of the same shape. The trainer broadcasts each
sample's advantage over that sample's loss tokens (``batch.py``).

A group whose rewards are all equal carries no learning signal: every estimator returns exactly
``0.0`` for it (not a rounding residue), and ``compute_advantages`` reports those groups in a mask so
the trainer can count "useful training samples" (ARCHITECTURE §7) without recomputing anything.

Estimators are registered by name (``@register_advantage("grpo")``); configs name an estimator and
are validated against ``ADVANTAGE_ESTIMATORS`` itself, so the allowed names can never drift from
what is implemented.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from pipelines_lib.registry import registering

AdvantageFn = Callable[[jax.Array, float], jax.Array]
"""``(rewards_gk, eps) -> advantages_gk``."""

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an estimator under ``name``; names are unique."""

    return registering(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered as ``name``; the error lists the valid names."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    return ADVANTAGE_ESTIMATORS[name]


@register_advantage("grpo")
def grpo_advantages(rewards_gk: jax.Array, eps: float) -> jax.Array:
    """Group-normalised advantage (Shao et al. 2024, DeepSeekMath, §4.1.2 outcome supervision).

    ``A_i = (r_i − mean(r)) / (std(r) + eps)`` over the group, with the population standard
    deviation (ddof = 0), so rewards ``[1, 0, 0, 1]`` give ``±0.5 / (0.5 + eps)``.
    """
    mean_g1 = rewards_gk.mean(axis=1, keepdims=True)
    std_g1 = rewards_gk.std(axis=1, keepdims=True)
    return (rewards_gk - mean_g1) / (std_g1 + eps)


@register_advantage("drgrpo")
def drgrpo_advantages(rewards_gk: jax.Array, eps: float) -> jax.Array:
    """Mean-centred advantage of Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training").

    ``A_i = r_i − mean(r)``: dropping GRPO's division by the group std removes its question-level
    difficulty bias. ``eps`` is unused (kept for a uniform signature).
    """
    del eps
    return rewards_gk - rewards_gk.mean(axis=1, keepdims=True)


@register_advantage("rloo")
def rloo_advantages(rewards_gk: jax.Array, eps: float) -> jax.Array:
    """Leave-one-out baseline (Ahmadian et al. 2024, "Back to Basics"; Kool et al. 2019).

    ``A_i = r_i − (1 / (k − 1)) Σ_{j≠i} r_j = k / (k − 1) · (r_i − mean(r))`` for group size ``k``.
    ``eps`` is unused (kept for a uniform signature).
    """
    del eps
    group_size = rewards_gk.shape[1]
    if group_size < 2:
        raise ValueError(f"rloo needs group_size >= 2, got {group_size}")
    leave_one_out_mean_gk = (rewards_gk.sum(axis=1, keepdims=True) - rewards_gk) / (group_size - 1)
    return rewards_gk - leave_one_out_mean_gk


def degenerate_groups(rewards_gk: jax.Array) -> jax.Array:
    """``bool[n_groups]``: True where every reward in the group is equal (no learning signal): the in-graph form
    of ``trajectory.window.zero_advantage``, which the rollout side and the trainer's batch filter use."""
    return jnp.all(rewards_gk == rewards_gk[:, :1], axis=1)


def compute_advantages(
    rewards_gk: jax.Array, *, estimator: str = "grpo", eps: float = 1e-6
) -> tuple[jax.Array, jax.Array]:
    """Advantages of whole groups and the mask of degenerate groups.

    Args:
      rewards_gk: ``float[n_groups, group_size]``, one row per GRPO group.
      estimator: a key of ``ADVANTAGE_ESTIMATORS``.
      eps: numerical guard of normalising estimators.

    Returns:
      ``(advantages_gk float32[n_groups, group_size], degenerate_g bool[n_groups])``; advantages of
      degenerate groups are exactly zero.
    """
    if rewards_gk.ndim != 2:
        raise ValueError(f"rewards_gk must be [n_groups, group_size], got shape {rewards_gk.shape}")
    rewards_gk = jnp.asarray(rewards_gk, jnp.float32)
    degenerate_g = degenerate_groups(rewards_gk)
    advantages_gk = get_advantage(estimator)(rewards_gk, eps)
    # Rounding in mean() can leave ~1e-8 residues on equal rewards; the contract is an exact zero.
    return jnp.where(degenerate_g[:, None], 0.0, advantages_gk), degenerate_g
