"""Figures over seeds and the claims they support (``bench.seeds``), and how the ablation judges its claims."""

from __future__ import annotations

import pytest

from bench.ablation import ARMS, QUICK_ARMS, chosen_arms
from bench.arm_stats import ablation_figures
from bench.learning import SeedRun, seed_figures
from bench.seeds import Claim, OverSeeds, seed_args, seed_overrides
from pipelines_lib.config import CampaignConfig


def test_a_figure_over_seeds_reports_mean_min_spread_and_a_t_interval() -> None:
    gains = OverSeeds((90.0, 80.0, 85.0))
    # t(0.975, 2) = 4.303; sd = 5; half width 4.303 * 5 / sqrt(3) = 12.42
    assert gains.figures("learning.heldout_gain_pts") == {
        "learning.heldout_gain_pts": 85.0,
        "learning.heldout_gain_pts_min": 80.0,
        "learning.heldout_gain_pts_spread": 10.0,
        "learning.heldout_gain_pts_ci_low": pytest.approx(72.58),
        "learning.heldout_gain_pts_ci_high": pytest.approx(97.42),
    }
    assert OverSeeds((70.0,)).interval() == (70.0, 70.0)
    with pytest.raises(ValueError, match="one finite value per seed"):
        OverSeeds((float("nan"),))


def test_a_claim_holds_only_where_the_whole_interval_of_the_paired_difference_does() -> None:
    sync, close, far = [95.0, 96.0, 94.0], [94.0, 95.5, 93.0], [90.0, 97.0, 80.0]
    assert Claim.within("close", sync, close, 3.0).supported
    assert not Claim.within("far", sync, far, 3.0).supported  # mean gap 6, interval reaches past 3
    assert Claim.worse("lower", sync, [60.0, 70.0, 65.0]).supported
    assert not Claim.worse("level", sync, [96.0, 95.0, 94.0]).supported
    assert not Claim.within("one seed", [95.0], [95.0], 3.0).supported  # no interval, no claim
    assert Claim.within("one seed", [95.0], [94.0], 3.0).render() == "one seed: open, one paired seed (difference 1.0 pts)"


def test_the_ablation_pairs_arms_by_seed_for_its_gaps_and_claims_under_the_names_its_record_has() -> None:
    def arm(final: float, wall: float, reached_s: float) -> dict[str, object]:
        return {"final_success": final, "wall_s": wall, "steps": 30.0, "admission_wait_s": wall / 10,
                "curve": [(0, 0.0, 0.1), (30, reached_s, final)]}

    runs = {
        0: {"sync": arm(0.95, 100.0, 90.0), "eta4": arm(0.94, 40.0, 30.0), "eta4_nocorr": arm(0.60, 40.0, 30.0)},
        1: {"sync": arm(0.90, 120.0, 100.0), "eta4": arm(0.89, 36.0, 30.0), "eta4_nocorr": arm(0.65, 36.0, 30.0)},
        2: {"sync": arm(0.97, 110.0, 95.0), "eta4": arm(0.955, 44.0, 32.0), "eta4_nocorr": arm(0.55, 44.0, 30.0)},
    }
    figures, judged, open_ = ablation_figures(runs, ARMS, prefix="ablation.")
    assert figures["ablation.seeds"] == 3.0
    assert figures["ablation.eta4_gap_pts"] == pytest.approx(1.17)  # gaps 1, 1, 1.5
    assert figures["ablation.eta4_nocorr_gap_pts"] == pytest.approx(34.0)  # sync − uncorrected: 35, 25, 42
    assert figures["ablation.eta4_correction_gain_pts"] == pytest.approx(32.83)  # corrected − uncorrected
    assert figures["ablation.eta4.final_pts_min"] == pytest.approx(89.0)
    assert figures["ablation.sync.final_success"] == pytest.approx(0.94)
    assert figures["ablation.sync.admission_wait_s"] == pytest.approx(11.0)
    assert figures["ablation.seed1.eta4_nocorr.final_success"] == 0.65
    assert figures["ablation.eta4_over_sync_wallclock"] == pytest.approx((0.4 + 0.3 + 0.4) / 3, abs=1e-4)
    assert figures["ablation.eta4_nocorr_over_sync_wallclock"] == pytest.approx((0.4 + 0.3 + 0.4) / 3, abs=1e-4)
    # (a) within 3 points, (b) at the target in under half sync's time, (c) the uncorrected arm ends below.
    assert [(c.text[:3], c.supported) for c in judged] == [("(a)", True), ("(b)", True), ("(c)", True)]
    assert figures["ablation.claim.a.supported"] == figures["ablation.claim.c.supported"] == 1.0
    # The arms no seed ran are open, and so is the claim on η = 8's correction.
    assert "arm eta8: no run yet" in open_ and "claim (d): 0 paired seed(s), an interval needs 2 or more" in open_


def test_seed_n_sets_every_seed_of_a_campaign() -> None:
    config = CampaignConfig.tiny().with_overrides(seed_overrides(7))
    assert (config.seed, config.dataset.seed, config.sft.seed, config.trainer.seed) == (7, 7, 7, 7)
    assert seed_args(7)[:2] == ["--set", "seed=7"]


def test_the_learning_benchmark_reports_every_seed_and_the_worst_one() -> None:
    def run(seed: int, v0: float, last: float, wall: float) -> SeedRun:
        evals = {
            0: {"step": 0, "greedy": v0, "pass_at_k": 0.6},
            15: {"step": 30, "greedy": last, "pass_at_k": 0.97},
        }
        return SeedRun(seed=seed, wall_s=wall, evals=evals, steps=list(range(1, 31)), rewards=[0.5] * 30)

    runs = [run(0, 0.0, 0.95, 300.0), run(1, 0.01, 0.78, 320.0), run(2, 0.0, 0.90, 410.0)]
    figures = seed_figures(runs)
    assert figures["learning.seeds"] == 3.0
    assert figures["learning.heldout_gain_pts_min"] == pytest.approx(77.0)
    assert figures["learning.heldout_gain_pts_spread"] == pytest.approx(18.0)
    assert figures["learning.seed1.final_success"] == 0.78
    assert figures["learning.final_success_min"] == 0.78
    assert figures["learning.wallclock_s"] == 410.0  # the longest wait, not the mean
    assert runs[1].row(4)["gain (pts)"] == "+77.0" and runs[1].row(4)["trainer steps"] == 30


def test_the_ablation_runs_the_arms_asked_for_in_its_own_order_and_always_sync() -> None:
    assert chosen_arms(None, quick=False) == ARMS and chosen_arms(None, quick=True) == QUICK_ARMS
    assert chosen_arms(["eta4_nocorr", "eta4"], quick=False) == ("sync", "eta4", "eta4_nocorr")
    with pytest.raises(ValueError, match="unknown ablation arm.s. eta3"):
        chosen_arms(["eta3"], quick=False)
