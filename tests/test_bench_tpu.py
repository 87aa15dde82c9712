"""The accelerator benchmarks (``bench/tpu.py``): their counts by hand, their code paths at a small size on the
CPU (so they cannot rot where CI runs), and nothing recorded where there is no accelerator."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from flax import nnx

from bench.registry import BenchContext, Budget
from bench.runner import run_benchmarks
from bench.tpu import (
    QUICK,
    Peak,
    bench_tpu_train,
    matmul_params,
    measure_campaign,
    measure_engine,
    measure_train,
    train_flops,
)
from bench.tpu_real import MemoryWatch, measure_real
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder

V5E = Peak(flops=197e12, hbm_bytes_per_s=819e9)


def _toy() -> Decoder:
    # vocab 16, d 8, one layer of 2 query heads and 1 KV head of 4, MLP 8, tied embeddings.
    cfg = ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, d_ff=8,
                      max_seq_len=16, tie_embeddings=True)
    return Decoder(cfg, rngs=nnx.Rngs(0))


def test_flops_count_every_matmul_parameter_six_times_a_token_plus_causal_attention() -> None:
    model = _toy()
    # embedding 16·8 = 128 (once, as the unembedding); q 8·8 + k 8·4 + v 8·4 + o 8·8 = 192; MLP 3·8·8 = 192.
    assert matmul_params(model) == 512
    # 6 · 512 · (2 · 4) = 24576; attention 6 · 1 layer · 2 heads · 4 · 4² · 2 rows = 1536.
    assert train_flops(model, rows=2, length=4) == 26112


@pytest.mark.cpu_only
def test_tpu_benchmarks_record_nothing_without_an_accelerator(tmp_path: Path) -> None:
    lines: list[str] = []
    figures = run_benchmarks(["tpu_train", "tpu_engine", "tpu_campaign", "tpu_real"], out_dir=tmp_path,
                             progress=lines.append)
    assert figures == {}
    assert not (tmp_path / "bench" / "results.json").exists()
    assert sum("skipped, nothing recorded: no accelerator" in line for line in lines) == 4


# The TPU benchmark's code paths at a CPU size (about 40 s each): `make test-all`.
@pytest.mark.slow
def test_measure_train_and_engine_run_their_code_paths_at_a_small_size() -> None:
    train = measure_train(QUICK, V5E)
    assert train["model_build_s"] > 0 and train["train_first_step_s"] > train["train_step_s"] > 0
    assert 0 < train["train_mfu"] < 1 and train["train_mfu"] == train["train_mfu_remat_attention"]
    assert 0 < train["train_mfu_remat_full"] < 1
    engine = measure_engine(QUICK, V5E)
    assert engine["engine_warmup_s"] > 0
    for slots in QUICK["slots"]:
        assert engine[f"engine_tokens_per_s_{slots}"] > 0 and engine[f"engine_roofline_fraction_{slots}"] > 0
        # every slot was given a request: the steps ran all of them, and each request took one prefill row
        assert engine[f"engine_slot_occupancy_{slots}"] > 0.5 and engine[f"engine_prefill_calls_{slots}"] >= 1
        assert engine[f"engine_decode_steps_{slots}"] >= QUICK["new_tokens"] - 1
        # the split: the prefill takes part of the serve, and the decode steps after it are at least as fast as
        # the whole serve's average step (which the prefill slows)
        assert 0 < engine[f"engine_prefill_share_{slots}"] < 1
        assert engine[f"engine_roofline_fraction_decode_{slots}"] >= engine[f"engine_roofline_fraction_{slots}"]


# The TPU benchmark's code paths at a CPU size (about 40 s each): `make test-all`.
@pytest.mark.slow
def test_measure_campaign_runs_the_tpu_demo_preset_colocated_at_a_small_size(tmp_path: Path) -> None:
    out = measure_campaign(tmp_path, quick=True)
    assert out["campaign_last_version"] == 1 and out["campaign_wall_s"] > 0
    assert out["campaign_heldout_gain_points"] == pytest.approx(
        100 * (out["campaign_last_greedy"] - out["campaign_v0_greedy"]))
    manifest = json.loads((tmp_path / "tpu_demo" / "campaign.json").read_text())
    assert manifest["config"]["placement"] == "colocated"


@pytest.mark.tpu
def test_tpu_train_benchmark_names_the_chip_and_measures_on_it(tmp_path: Path) -> None:
    result = bench_tpu_train(BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path, progress=print))
    assert result.labels["tpu.device"].startswith("TPU")
    assert 0 < result.figures["tpu.train_mfu"] < 1


# Three small colocated campaigns (and a warm-up) and the parts alone on a CPU (minutes on 2 shared cores): `make test-all`.
@pytest.mark.slow
def test_measure_real_runs_the_tpu_real_campaigns_from_an_exported_hf_folder_at_a_small_size(tmp_path: Path) -> None:
    out = measure_real(tmp_path, quick=True, log=lambda line: None)
    assert out["campaign_fits"] == 1 and out["hbm_plan_gib"] > 0 and out["kv_blocks"] >= 1
    assert (tmp_path / "hf-random" / "config.json").is_file()
    manifest = json.loads((tmp_path / "campaign-none" / "campaign.json").read_text())
    assert manifest["config"]["init_from"] == str(tmp_path / "hf-random")
    assert manifest["config"]["engine"]["num_blocks"] == "auto"
    assert [json.loads((tmp_path / f"campaign-{name}" / "campaign.json").read_text())["config"]["rollout"][
        "lead_versions"] for name in ("none", "heavy", "lead")] == [0, 0, 1]
    # a version ahead, the lead campaign's two quick steps train on groups all generated before its window opens
    assert out["rollout_tokens_per_s_none"] > 0 and out["rollout_tokens_per_s_heavy"] > 0
    for name in ("none", "heavy", "lead"):
        assert out[f"trained_tokens_per_s_{name}"] > 0
        assert out[f"time_share_{name}"] == pytest.approx(
            out[f"rollout_tokens_per_s_{name}"] / out["engine_alone_tokens_per_s"]
            + out[f"trained_tokens_per_s_{name}"] / out["trainer_alone_tokens_per_s"])
    assert 0 < out["handover_s"] < 60 and out["trajectories_per_hour"] > 0
    # the chip's busy share and the trainer's writing shares are shares of the window (step 1's publication and its
    # write come after step 1's log, which opens the window)
    assert 0 < out["chip_busy_none"] <= 1
    assert 0 < out["publish_wait_share_none"] <= 1 and 0 < out["write_share_none"] <= 1
    assert 0 <= out["rollout_wait_share_none"] <= 1 and out["version_write_s_none"] > 0
    assert (tmp_path / "campaign-warmup" / "train" / "DONE.json").is_file()  # the programs compiled before any window
    assert out["campaign_wall_s_none"] > 0 and out["campaign_wall_s_heavy"] > 0 and out["campaign_wall_s_lead"] > 0
    assert "heavy_skipped" not in out and "lead_skipped" not in out


class _Spent(Budget):
    def affords(self, cost_s: float) -> bool:
        return False


# One small colocated campaign and the parts alone on a CPU: `make test-all`.
@pytest.mark.slow
def test_measure_real_without_budget_for_more_campaigns_records_the_first_and_says_so(tmp_path: Path) -> None:
    out = measure_real(tmp_path, quick=True, log=lambda line: None, budget=_Spent(None))
    assert out["heavy_skipped"] == out["lead_skipped"] == 1
    assert not (tmp_path / "campaign-heavy").exists() and not (tmp_path / "campaign-lead").exists()
    assert "time_share_heavy" not in out and "rollout_tokens_per_s_heavy" not in out
    assert out["time_share_none"] > 0 and out["handover_s"] == out["handover_s_none"]


def test_the_memory_watch_keeps_the_largest_sum_of_arrays_and_reserved_scratch_it_saw() -> None:
    reports = iter([{"bytes_in_use": 5, "bytes_reserved": 1}, {"bytes_in_use": 3, "bytes_reserved": 7},
                    {"bytes_in_use": 8}])
    seen = threading.Event()

    def stats() -> dict[str, int]:
        report = next(reports, None)
        if report is None:
            seen.set()
            return {"bytes_in_use": 1}
        return report

    with MemoryWatch(stats, interval_s=0.001) as watch:
        assert seen.wait(10)
    assert watch.peak_bytes == 10  # 3 + 7: later, smaller reports do not lower it
    with MemoryWatch(lambda: None, interval_s=0.001) as silent:  # a CPU reports no memory stats
        time.sleep(0.01)
    assert silent.peak_bytes is None
