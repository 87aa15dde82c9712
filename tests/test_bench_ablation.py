"""The ablation and learning2 benchmarks' read-back of a campaign folder, on a folder written by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ablation import mismatch_figures, success_curve
from bench.learning import version_rows
from bench.registry import BenchContext
from pipelines_lib.campaign import init_campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store


def hand_written_campaign(root: Path) -> Store:
    """Two steps (v1 published at step 2, 30 s after the trainer started) and evaluations of v0 and v1."""
    store = Store(str(root))
    init_campaign(store, CampaignConfig.twostep())
    for step, (diff, kl, capped) in enumerate([(0.1, 0.02, 0.0), (0.3, 0.06, 0.5)], start=1):
        store.create_json(layout.consumed_log(step), {"step": step, "metrics": {
            "prox_behav_logp_abs_diff": diff, "behav_prox_kl": kl, "correction_frac_tis": capped}})
    store.create_json(layout.TRAIN_DONE, {"wall_s": 40.0, "finished_at": "2026-01-01T00:00:40+00:00"})
    for version, step, at, greedy in [(0, 0, "2025-12-31T23:59:00+00:00", 0.25), (1, 2, "2026-01-01T00:00:30+00:00", 0.5)]:
        store.advance_pointer(layout.WEIGHTS_LATEST, {"version": version, "path": layout.weights_dir(version),
                                                      "step": step, "published_at": at})
        store.create_json(f"eval/v{version:08d}.json", {"greedy_success_rate": greedy, "pass@k": greedy + 0.25,
                                                        "greedy": {"format_rate": 1.0}})
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
