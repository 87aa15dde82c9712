"""Golden numbers for the group-relative advantage estimators (checkable by hand)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipelines_lib.train.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    get_advantage,
    register_advantage,
)

EPS = 1e-6
# Three groups of four: a 2-vs-2 split, an asymmetric group, and a degenerate (all-equal) group.
REWARDS_GK = [[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0], [0.7, 0.7, 0.7, 0.7]]
SQRT_HALF = math.sqrt(0.5)  # std of [3, 1, 2, 2]: deviations [1, -1, 0, 0], variance 2 / 4

GOLDEN = {
    # (r - mean) / (std + eps): group 1 mean .5 std .5; group 2 mean 2 std sqrt(.5).
    "grpo": [
        [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)],
        [1 / (SQRT_HALF + EPS), -1 / (SQRT_HALF + EPS), 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
    ],
    # r - mean.
    "drgrpo": [[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
    # r_i - mean of the other three: 1 - 1/3, 0 - 2/3; 3 - 5/3, 1 - 7/3, 2 - 6/3.
    "rloo": [
        [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3],
        [3 - 5 / 3, 1 - 7 / 3, 2 - 6 / 3, 2 - 6 / 3],
        [0.0, 0.0, 0.0, 0.0],
    ],
}


@pytest.mark.parametrize("estimator", sorted(GOLDEN))
def test_estimator_matches_hand_computed_values(estimator: str) -> None:
    advantages_gk, degenerate_g = compute_advantages(jnp.array(REWARDS_GK), estimator=estimator, eps=EPS)
    np.testing.assert_allclose(advantages_gk, GOLDEN[estimator], rtol=1e-6, atol=1e-7)
    assert degenerate_g.tolist() == [False, False, True]


def test_every_registered_estimator_has_golden_values() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == set(GOLDEN)


@pytest.mark.parametrize("estimator", sorted(GOLDEN))
@pytest.mark.parametrize("value", [0.1, 1 / 3, 1e6 + 0.1, -2.7])
def test_all_equal_rewards_give_exactly_zero_advantage(estimator: str, value: float) -> None:
    # Values like 1/3 leave float rounding residues in mean(); the contract is an exact 0.
    rewards_gk = jnp.full((2, 7), value, jnp.float32)
    advantages_gk, degenerate_g = compute_advantages(rewards_gk, estimator=estimator)
    assert (advantages_gk == 0.0).all()
    assert int(degenerate_g.sum()) == 2


@pytest.mark.parametrize("estimator", sorted(GOLDEN))
def test_advantages_sum_to_zero_within_each_group(estimator: str) -> None:
    rewards_gk = jax.random.uniform(jax.random.key(0), (5, 8))
    advantages_gk, _ = compute_advantages(rewards_gk, estimator=estimator)
    np.testing.assert_allclose(advantages_gk.sum(axis=1), 0.0, atol=1e-5)


def test_compute_advantages_jits_with_the_estimator_static() -> None:
    jitted = jax.jit(compute_advantages, static_argnames=("estimator", "eps"))
    advantages_gk, _ = jitted(jnp.array(REWARDS_GK), estimator="rloo", eps=EPS)
    np.testing.assert_allclose(advantages_gk, GOLDEN["rloo"], rtol=1e-6, atol=1e-6)


def test_unknown_estimator_error_names_the_valid_choices() -> None:
    with pytest.raises(ValueError, match=r"'ppo'.*\['drgrpo', 'grpo', 'rloo'\]"):
        get_advantage("ppo")


def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda rewards_gk, eps: rewards_gk)


@pytest.mark.parametrize(
    ("rewards", "estimator", "match"),
    [([1.0, 0.0, 1.0], "grpo", "n_groups, group_size"), ([[1.0], [0.0]], "rloo", "group_size >= 2")],
)
def test_bad_shapes_are_refused(rewards: list, estimator: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_advantages(jnp.array(rewards), estimator=estimator)
