"""The ablation and learning2 benchmarks' read-back of a campaign folder, on a folder written by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ablation import mismatch_figures, shared_config, success_curve
from bench.campaign_arms import PROFILES, arm_overrides
from bench.learning import version_evals, version_rows
from bench.registry import BenchContext
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import to_mapping
from pipelines_lib.records import ConsumptionLog, DoneMarker, EvalResult, Publication
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store


def hand_written_campaign(root: Path) -> Store:
    """Two steps (v1 published at step 2, 30 s after the trainer started) and evaluations of v0 and v1."""
    store = Store(str(root))
    init_campaign(store, CampaignConfig.preset("twostep"))
    for step, (diff, kl, capped) in enumerate([(0.1, 0.02, 0.0), (0.3, 0.06, 0.5)], start=1):
        ConsumptionLog(step=step, trainer_version=0, created_at="2026-01-01T00:00:10+00:00", groups=[], metrics={
            "prox_behav_logp_abs_diff": diff, "behav_prox_kl": kl, "correction_frac_tis": capped}).write(store)
    DoneMarker(steps=2, version=1, groups_consumed=0, groups_dropped_stale=0, shards_skipped=0, idle_s=0.0,
               busy_s=40.0, wall_s=40.0, tokens_trained=0, finished_at="2026-01-01T00:00:40+00:00").write(store)
    for version, step, at, greedy in [(0, 0, "2025-12-31T23:59:00+00:00", 0.25), (1, 2, "2026-01-01T00:00:30+00:00", 0.5)]:
        Publication(version=version, path=layout.weights_dir(version), step=step, published_at=at).advance(store)
        EvalResult(version=version, split="heldout", temperature=1.0, tasks=4, k=1, greedy={"format_rate": 1.0},
                   greedy_success_rate=greedy, pass_at_k=greedy + 0.25, wall_s=1.0, generated_tokens=0).write(store)
    return store


def test_ablation_reads_step_means_of_the_mismatch_and_a_success_curve_per_version(tmp_path: Path) -> None:
    store = hand_written_campaign(tmp_path / "c")
    assert mismatch_figures(store) == pytest.approx(
        {"mismatch_mean": 0.2, "behav_prox_kl_mean": 0.04, "tis_capped_frac_mean": 0.25})
    ctx = BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path, progress=lambda _: None)
    # v0 was published before the trainer started (clamped to 0 s); v1 30 s after it (started at 00:00:00).
    assert success_curve(ctx, store) == [(0, 0.0, 0.25), (2, pytest.approx(30.0), 0.5)]


def test_version_rows_show_greedy_pass_at_k_and_the_well_formed_share() -> None:
    evals = {0: {"step": 0, "greedy": 0.25, "pass_at_k": 0.5, "format": 0.95}}
    assert version_rows(evals, 4) == [{"version": 0, "trainer step": 0, "held-out greedy success": "25.0%",
                                       "pass@4 (sampled)": "50.0%", "greedy answers well-formed": "95.0%"}]


def test_version_evals_read_every_second_version_and_the_last(tmp_path: Path) -> None:
    store = hand_written_campaign(tmp_path / "c")
    for version in (2, 3):  # evaluated already, so version_evals only reads them back
        Publication(version=version, path=layout.weights_dir(version), step=2 * version,
                    published_at="2026-01-01T00:00:35+00:00").advance(store)
        EvalResult(version=version, split="heldout", temperature=1.0, tasks=4, k=1, greedy={}, greedy_success_rate=0.75,
                   pass_at_k=1.0, wall_s=1.0, generated_tokens=0).write(store)
    ctx = BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path, progress=lambda _: None)
    assert sorted(version_evals(ctx, store, every=2)) == [0, 2, 3]
    assert sorted(version_evals(ctx, store)) == [0, 1, 2, 3]


def test_ablation_arms_run_twostep_under_heavy_tool_latency_with_deadlines_a_loaded_machine_does_not_reach() -> None:
    full = shared_config(quick=False)
    assert (full.env.name, full.trainer.max_steps, full.trainer.publish_every, full.eval.n_tasks) == ("twostep", 30, 2, 64)
    assert to_mapping(full.env.tool_latency) == to_mapping(PROFILES["heavy"])
    assert (full.rollout.episode_timeout_s, full.rollout.tool_timeout_s) == (600.0, 30.0)
    # The sync arm's budget is one version's batch: 8 groups x 2 steps over 2 workers.
    assert arm_overrides("sync", full)["rollout.max_groups_per_version"] == 8
    assert to_mapping(shared_config(quick=True).env.tool_latency) == to_mapping(PROFILES["heavy"])
