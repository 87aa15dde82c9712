"""The ``bench`` benchmark: arm configs, and figures read back from a campaign folder, on synthetic
consumption logs, telemetry and shards with golden numbers; the whole benchmark end to end is marked slow."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from bench import campaign_arms
from bench.campaign_arms import (
    arm_figures,
    arm_overrides,
    consumption_figures,
    headline_figures,
    median_step_s,
    nearest_rank,
    shared_config,
    telemetry_figures,
)
from bench.registry import BenchContext, load_benches
from harness.fixtures import done_marker, eval_result, run_record
from pipelines_lib.config import CampaignConfig
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.records import ConsumedGroup, ConsumptionLog, DroppedStale, ZeroAdvantageGroup
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.trace import summarize
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.writer import ShardWriter


def test_sync_arm_budgets_one_versions_batch_per_worker_and_eta_arms_set_only_eta() -> None:
    config = CampaignConfig.tiny().with_overrides({"trainer.batch_groups": 6, "trainer.publish_every": 1,
                                                   "workers": 4})
    # 6 groups per version over 4 workers: ⌈6 / 4⌉ = 2 each.
    assert arm_overrides("sync", config) == {"rollout.eta": 0, "rollout.max_groups_per_version": 2,
                                             "rollout.backpressure_max_wait_s": campaign_arms.SYNC_TOPUP_WAIT_S}
    assert arm_overrides("eta2", config) == {"rollout.eta": 2}
    for arm in campaign_arms.ARMS:  # every arm is a valid config
        config.with_overrides({**campaign_arms.COMMON, **arm_overrides(arm, config)})
    with pytest.raises(ValueError, match="valid: sync, eta<k>, eta<k>_nocorr"):
        arm_overrides("eta", config)


def test_uncorrected_arms_set_eta_and_turn_the_off_policy_correction_off() -> None:
    config = CampaignConfig.preset("twostep")
    assert arm_overrides("eta8_nocorr", config) == {"rollout.eta": 8, "trainer.step.loss.correction": "none"}
    assert config.with_overrides(arm_overrides("eta4_nocorr", config)).trainer.step.loss.correction == "none"
    assert config.trainer.step.loss.correction == "tis"  # the corrected arms keep the default


def test_shared_config_is_the_preset_with_the_sizes_and_only_the_profiles_tool_latency() -> None:
    heavy = shared_config(campaign_arms.FULL, "heavy")
    light = shared_config(campaign_arms.FULL, "light")
    assert heavy.env.tool_latency == LatencyProfile.heavy() and light.env.tool_latency == LatencyProfile.light()
    assert dataclasses.replace(heavy, env=light.env) == light  # nothing else differs between profiles
    assert heavy.eval.n_tasks == 256 and heavy.eval.samples == 1
    tiny = CampaignConfig.tiny()
    # The preset's rollout; its trainer and warm start at the recipe the arms were measured with.
    assert heavy.rollout == tiny.rollout
    assert heavy.trainer == dataclasses.replace(tiny.trainer, max_steps=30, checkpoint_every=5)
    assert heavy.sft == dataclasses.replace(tiny.sft, error_rate=0.6)
    with pytest.raises(ValueError, match="valid: \\['heavy', 'light'\\]"):
        shared_config(campaign_arms.FULL, "real")


@pytest.mark.parametrize("profile", ["heavy", "light"])
def test_the_shared_config_file_pins_every_field_whatever_the_preset_becomes(tmp_path: Path, profile: str) -> None:
    shared = shared_config(campaign_arms.FULL, profile)  # the light profile's inf cap survives YAML too
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(shared.to_dict()))
    edited = dataclasses.replace(CampaignConfig.tiny(), seed=7)  # a preset edited while the arms run
    assert CampaignConfig.from_yaml(path, base=edited) == shared


def test_headline_figures_are_the_success_gap_in_points_and_the_wall_clock_ratio_under_the_benchmarks_name() -> None:
    arms = {"sync": {"final_success": 0.50, "wall_s": 200.0}, "eta2": {"final_success": 0.48, "wall_s": 90.0}}
    assert headline_figures("bench_light", arms) == {
        "bench_light.eta2_success_gap_pts": 2.0,  # 50 - 48 points
        "bench_light.eta2_over_sync_wallclock": 90 / 200}


def test_bench_runs_every_arm_with_heavy_latency_and_bench_light_sync_and_eta2_with_light(monkeypatch) -> None:
    seen = []
    benches = load_benches()
    monkeypatch.setattr(campaign_arms, "run_arms",
                        lambda ctx, name, profile, arms: seen.append((name, profile, tuple(arms))))
    for name in ("bench", "bench_light"):
        benches[name].fn(None)
    assert seen == [("bench", "heavy", ("sync", "eta0", "eta1", "eta2")), ("bench_light", "light", ("sync", "eta2"))]
    assert [g.key for g in benches["bench"].goals] == ["bench.eta2_success_gap_pts", "bench.eta2_over_sync_wallclock"]


def test_nearest_rank_p95_is_the_ceil_095n_th_smallest() -> None:
    assert nearest_rank([0, 1, 2, 0], 0.95) == 2  # ⌈3.8⌉ = 4th of [0, 0, 1, 2]
    assert nearest_rank(list(range(1, 21)), 0.95) == 19  # ⌈19⌉ = 19th
    assert nearest_rank([7], 0.95) == 7


def _log(groups: list[tuple[str, int]], *, dropped: list[list[str]] = (), zero_adv: int = 0, step: int = 1,
         created_at: str = "t", mean_reward: float | None = None) -> ConsumptionLog:
    return ConsumptionLog(
        step=step, trainer_version=2, created_at=created_at, mean_reward=mean_reward,
        groups=[ConsumedGroup(group_id=g, shard="s", row_start=0, row_end=4, version=2 - s, staleness=s)
                for g, s in groups],
        dropped_stale=[DroppedStale(shard="s", groups=d, reason="stale") for d in dropped],
        skipped_zero_advantage=[ZeroAdvantageGroup(group_id=f"z{i}", shard="s", reward=0.0) for i in range(zero_adv)])


def test_consumption_figures_count_useful_groups_staleness_and_dropped_share() -> None:
    rewards = {"g1": [1, 0, 1, 1], "g2": [0, 0, 0, 0], "g3": [1, 1, 0, 0], "g4": [1, 1, 1, 1]}
    logs = [_log([("g1", 0), ("g2", 1)], dropped=[["a", "b"]]), _log([("g3", 2), ("g4", 0)], zero_adv=1)]
    f = consumption_figures(logs, lambda g: rewards[g.group_id])
    assert f["steps"] == 2 and f["groups_trained"] == 4
    assert f["useful_groups"] == 2 and f["useful_samples"] == 8  # g1 and g3, 4 samples each
    assert f["staleness_mean"] == (0 + 1 + 2 + 0) / 4
    assert f["staleness_p95"] == 2 and f["staleness_max"] == 2
    assert f["dropped_stale_groups"] == 2
    assert f["dropped_stale_share"] == 2 / (4 + 1 + 2)  # over trained + zero-advantage skipped + dropped


def _span(process: str, name: str, ts_s: float, dur_s: float) -> dict:
    return {"type": "span", "name": name, "process": process, "track": "weights", "ts_us": int(ts_s * 1e6),
            "dur_us": int(dur_s * 1e6), "tags": {}}


def _step(process: str, ts_s: float, dur_s: float) -> dict:
    return {**_span(process, "train_step", ts_s, dur_s), "track": "trainer"}


def test_median_step_leaves_out_the_first_compiling_step_and_other_processes_spans() -> None:
    records = [_step("trainer", 5, 3.0), _step("trainer", 1, 14.0), _step("trainer", 9, 2.0),
               _step("trainer", 12, 6.0), _span("rollout-rollout0", "train_step", 2, 99.0)]
    assert median_step_s(records) == 3.0  # median of 3, 2, 6; the 14 s step came first (ts 1)
    assert median_step_s([_step("trainer", 1, 14.0)]) is None


def _value(kind: str, process: str, name: str, ts_s: float, value: float) -> dict:
    return {"type": kind, "name": name, "process": process, "ts_us": int(ts_s * 1e6), "value": value, "tags": {}}


TELEMETRY = [
    _value("count", "rollout-rollout0", "status.ok", 1, 6.0),  # a running total: the later one counts
    _value("count", "rollout-rollout0", "status.ok", 2, 10.0),
    _value("count", "rollout-rollout1", "status.ok", 2, 7.0),
    _value("count", "rollout-rollout1", "status.timeout", 2, 1.0),
    _value("count", "trainer", "staleness.0", 2, 5.0),
    _span("rollout-rollout0", "weight_swap", 1.0, 0.2),
    _span("rollout-rollout1", "weight_swap", 1.5, 0.4),
    _span("rollout-rollout0", "admission_wait", 1.1, 1.5),
    _span("trainer", "publish", 1.2, 0.25),
    _step("trainer", 0.5, 12.0),
    _step("trainer", 1.3, 2.5),
    _span("rollout-rollout1", "backpressure_wait", 1.2, 2.0),
    _value("gauge", "rollout-rollout0", "engine_busy_fraction", 1, 0.5),
    _value("gauge", "rollout-rollout0", "engine_busy_fraction", 2, 0.7),
    _value("gauge", "rollout-rollout1", "engine_busy_fraction", 2, 0.9),
    _value("gauge", "rollout-rollout0", "rss_mb", 1, 500.0),
    _value("gauge", "trainer", "rss_mb", 1, 800.0),
]


def test_telemetry_figures_sum_final_status_counts_and_average_spans_and_gauges() -> None:
    f = telemetry_figures(summarize(sorted(TELEMETRY, key=lambda r: r["ts_us"])))
    assert f["trajectories"] == 10 + 7 + 1
    assert f["weight_sync_pause_s"] == pytest.approx((0.2 + 0.4) / 2) and f["weight_swaps"] == 2
    assert f["admission_wait_s"] == pytest.approx(1.5) and f["backpressure_wait_s"] == pytest.approx(2.0)
    assert f["publish_s"] == pytest.approx(0.25)
    assert f["engine_busy"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert f["peak_rss_mb"] == 800.0


def test_telemetry_figures_leave_out_spans_that_never_happened() -> None:
    f = telemetry_figures(summarize([_value("gauge", "trainer", "rss_mb", 1, 300.0)]))
    assert f == {"trajectories": 0, "admission_wait_s": 0.0, "backpressure_wait_s": 0.0,
                 "peak_rss_mb": 300.0}


def _group(prompt: str, rewards: list[float]) -> list:
    group = synthetic_group(prompt_id=prompt, group_size=len(rewards), worker_id="w0", policy_version=0, seed=0)
    return [dataclasses.replace(t, reward=r) for t, r in zip(group, rewards, strict=True)]


def test_arm_figures_read_a_campaign_folder_shard_rows_done_marker_eval_and_telemetry(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "arm"))
    writer = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=2))
    writer.add_group(_group("a", [1, 0, 0, 0]))
    (info,) = writer.add_group(_group("b", [1, 1, 1, 1]))  # both groups in one shard: rows [0, 4) and [4, 8)
    ids = info.group_ids
    t0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
    at = lambda s: (t0 + dt.timedelta(seconds=s)).isoformat()  # noqa: E731
    log = _log([], dropped=[["x"]], created_at=at(50), mean_reward=0.625)
    dataclasses.replace(log, groups=[
        ConsumedGroup(group_id=ids[0], shard=info.path, row_start=0, row_end=4, version=2, staleness=0),
        ConsumedGroup(group_id=ids[1], shard=info.path, row_start=4, row_end=8, version=1, staleness=1)]).write(store)
    # The trainer ran 80 s and finished at t0 + 100 s, so it started at t0 + 20 s.
    done_marker(wall_s=80.0, idle_s=20.0, finished_at=at(100)).write(store)
    eval_result(0, greedy_success_rate=0.25).write(store)
    eval_result(2, greedy_success_rate=0.5).write(store)
    run_record("collect-w1", "f00", state="failed", attempt="1.1").write(store)
    run_record("train", "f00", state="completed").write(store)
    store.create("telemetry/rollout-rollout0-1-abc-00000.jsonl",
                 "".join(json.dumps(r) + "\n" for r in TELEMETRY).encode())
    f, curve = arm_figures(store)
    assert ids[0].startswith("a") and f["useful_groups"] == 1 and f["useful_samples"] == 4  # group a only
    assert f["useful_samples_per_hour"] == pytest.approx(4 / 80 * 3600)
    assert f["traj_per_hour"] == pytest.approx(18 / 80 * 3600)
    assert f["trainer_idle_fraction"] == pytest.approx(20 / 80)
    assert f["wall_s"] == 80.0 and f["staleness_mean"] == 0.5 and f["dropped_stale_share"] == pytest.approx(1 / 3)
    assert (f["v0_success"], f["final_success"], f["final_version"]) == (0.25, 0.5, 2)
    assert f["failed_stage_runs"] == 1
    assert f["train_step_s"] == 2.5  # the second step; the first compiles
    assert curve == [(pytest.approx(30.0), 0.625)]


@pytest.mark.parametrize(("code", "done", "fails"), [(0, True, False), (1, True, False), (1, False, True),
                                                     (2, True, True)])
def test_an_arm_fails_naming_why_unless_its_trainer_finished_and_the_exit_is_0_or_1(
        monkeypatch, tmp_path: Path, code: int, done: bool, fails: bool) -> None:
    # Exit 1 is also an audit with violations, whose figures are still read; without the DONE marker the campaign
    # failed, and the arm's error carries the campaign's own message rather than a missing-file error later.
    url = str(tmp_path / "arm")
    if done:
        done_marker(wall_s=80.0, idle_s=20.0, finished_at="2026-12-02T12:00:00+00:00").write(Store(url))
    ran = subprocess.CompletedProcess([], code, stdout="", stderr="DataTimeoutError: 500 all-equal groups")
    monkeypatch.setattr(campaign_arms.subprocess, "run", lambda *a, **k: ran)
    if not fails:
        assert campaign_arms._run_arm(url, tmp_path / "arms.yaml", {}, lambda line: None) >= 0
        return
    with pytest.raises(RuntimeError, match=rf"campaign {url} failed \(exit {code}") as raised:
        campaign_arms._run_arm(url, tmp_path / "arms.yaml", {}, lambda line: None)
    assert ("its trainer did not finish" in str(raised.value)) == (not done)
    assert "DataTimeoutError: 500 all-equal groups" in str(raised.value)


@pytest.mark.slow
def test_bench_runs_every_arm_end_to_end_and_reports_the_headline_keys(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(campaign_arms, "QUICK", {"trainer.max_steps": 2, "eval.n_tasks": 4})
    result = load_benches()["bench"].fn(BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path,
                                                     progress=lambda line: None))
    f = result.figures
    for key in ("eta2_success_gap_pts", "eta2_over_sync_wallclock"):
        assert math.isfinite(f[f"bench.{key}"])
    for arm in campaign_arms.ARMS:
        assert f[f"bench.{arm}.steps"] == 2 and f[f"bench.{arm}.traj_per_hour"] > 0
        assert 0 <= f[f"bench.{arm}.trainer_idle_fraction"] <= 1
    assert f["bench.sync.staleness_max"] == 0  # on-policy: every trained group came from the trainer's version
    assert (tmp_path / result.plots[0]).stat().st_size > 0
