"""The chip ablation's bookkeeping: time to target, paired claims over an incomplete ledger, resuming a ledger, the
chip busy fraction; and its quick form run for real on the CPU (two arms, then resumed from its ledger)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

import bench.tpu_ablation as tpu_ablation
from bench.arm_stats import ablation_figures, on_grid, time_to_target
from bench.cli import seed_range
from bench.registry import BenchContext, BenchSkipped
from pipelines_lib import telemetry
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.trace import chip_busy, read_records

CURVE = [[0, 0.0, 0.1], [2, 30.0, 0.4], [4, 50.0, 0.7], [6, 80.0, 0.65]]


def run(final: float, curve: list[list[float]] = CURVE, wall_s: float = 80.0) -> dict[str, Any]:
    return {"final_success": final, "curve": curve, "wall_s": wall_s}


def test_time_to_target_is_when_the_first_version_at_or_above_it_was_published() -> None:
    assert time_to_target(CURVE, 0.6) == 50.0
    assert time_to_target(CURVE, 0.4) == 30.0
    assert time_to_target(CURVE, 0.1) == 0.0  # v0 already there
    assert time_to_target(CURVE, 0.8) is None


def test_a_curve_on_a_grid_holds_the_last_version_published_at_or_before_each_point() -> None:
    assert on_grid(CURVE, [0, 29, 30, 79, 100], axis=1) == [0.1, 0.1, 0.4, 0.7, 0.65]
    assert on_grid(CURVE, [1, 4], axis=0) == [0.1, 0.7]


def test_claims_are_judged_on_paired_seeds_with_a_t_interval() -> None:
    # sync 0.60 / 0.70 / 0.80 -> mean 70 points, target 0.63; gaps 1, 2, 3 points: mean 2, sd 1,
    # t(0.975, 2) = 4.3027 -> half width 4.3027 / sqrt(3) = 2.484 -> interval 2 ± 2.48: (a) not supported.
    runs = {s: {"sync": run(f), "eta4": run(f - d / 100)} for s, (f, d) in enumerate([(0.6, 1), (0.7, 2), (0.8, 3)])}
    figures, claims, _ = ablation_figures(runs, ["sync", "eta4"], prefix="x.")
    assert figures["x.sync_final_pts_mean"] == 70.0
    assert figures["x.target_success"] == pytest.approx(0.63)
    assert figures["x.eta4_gap_pts"] == 2.0
    assert figures["x.eta4_gap_pts_ci_low"] == pytest.approx(-0.48, abs=0.01)
    assert figures["x.eta4_gap_pts_ci_high"] == pytest.approx(4.48, abs=0.01)
    assert figures["x.claim.a.supported"] == 0.0
    # Both arms reach 0.63 at 50 s on every seed: ratio 1 with no spread, so (b) is not supported (1 > 0.5).
    assert figures["x.eta4_time_to_target_ratio"] == 1.0 and figures["x.claim.b.supported"] == 0.0
    assert [c.text[:3] for c in claims] == ["(a)", "(b)"]


def test_a_seed_missing_from_one_arm_is_left_out_of_its_pairs_and_its_claims_stay_open() -> None:
    runs = {0: {"sync": run(0.7), "eta4": run(0.7)}, 1: {"sync": run(0.7)}}
    figures, claims, open_ = ablation_figures(runs, ["sync", "eta4", "eta4_nocorr"], prefix="x.")
    assert figures["x.sync.seeds"] == 2.0 and figures["x.eta4.seeds"] == 1.0
    assert figures["x.eta4_gap_pts"] == 0.0  # seed 0 alone
    assert "x.eta4_gap_pts_ci_high" not in figures  # one pair has no interval: a goal on it is not met by one value
    assert not any(c.supported for c in claims)  # one pair has no interval
    assert "arm eta4_nocorr: no run yet" in open_
    assert "claim (a): 1 paired seed(s), an interval needs 2 or more" in open_
    assert "claim (c): 0 paired seed(s), an interval needs 2 or more" in open_


def test_an_arm_that_never_reaches_the_target_is_censored_at_its_wall_clock_and_fails_the_ratio_claim() -> None:
    fast = [[0, 0.0, 0.0], [2, 10.0, 0.7]]  # reaches 0.63 at 10 s
    never = [[0, 0.0, 0.0], [2, 10.0, 0.3]]
    runs = {0: {"sync": run(0.7), "eta4": run(0.7, fast)}, 1: {"sync": run(0.7), "eta4": run(0.7, fast)},
            2: {"sync": run(0.7), "eta4": run(0.3, never, wall_s=20.0)}}
    figures, claims, _ = ablation_figures(runs, ["sync", "eta4"], prefix="x.")
    assert figures["x.eta4.never_reached"] == 1.0 and figures["x.eta4.time_to_target_s"] == 10.0
    # Ratios 10/50, 10/50 and, censored, 20/50: mean 0.2667, and the claim fails on the censored seed alone.
    assert figures["x.eta4_time_to_target_ratio"] == pytest.approx(0.27, abs=0.005)
    assert figures["x.eta4_time_to_target_censored"] == 1.0
    assert figures["x.claim.b.supported"] == 0.0
    assert "never reached it" in claims[1].text


def test_a_sync_run_that_never_reaches_the_target_anchors_no_ratio() -> None:
    runs = {0: {"sync": run(0.9, [[0, 0.0, 0.0], [2, 40.0, 0.9]]), "eta4": run(0.9)},
            1: {"sync": run(0.1, [[0, 0.0, 0.0], [2, 40.0, 0.1]]), "eta4": run(0.9)}}
    figures, _, open_ = ablation_figures(runs, ["sync", "eta4"], prefix="x.")
    assert figures["x.sync.never_reached"] == 1.0
    assert figures["x.eta4_time_to_target_ratio"] == pytest.approx(50.0 / 40.0)  # seed 0 alone
    assert any(line.startswith("seeds [1]: sync never reached the target") for line in open_)


def test_heavy_throughput_is_the_mean_of_per_seed_ratios_with_an_interval_and_v0_spread_is_over_seeds(
        tmp_path: Path) -> None:
    def arms(v0: float, sync_useful: float, eta4_useful: float) -> dict[str, dict[str, float]]:
        common = {"traj_per_hour": 100.0, "chip_busy": 0.5, "host_idle_share": 0.5, "wall_s": 10.0, "v0_success": v0}
        return {"sync": {**common, "useful_samples_per_hour": sync_useful},
                "eta4": {**common, "useful_samples_per_hour": eta4_useful}}

    ledger = tpu_ablation.Ledger(tmp_path / "l.json", "f", "chip", runs={
        0: arms(0.10, 10.0, 20.0), 1: arms(0.30, 10.0, 40.0), 2: {"eta4": arms(0.25, 1.0, 99.0)["eta4"]}})
    figures = tpu_ablation.throughput_figures(ledger) | tpu_ablation.v0_figures(ledger)
    # Seeds 0 and 1 pair: ratios 2 and 4, mean 3, t(0.975, 1) = 12.706 x stdev 1.414 / sqrt 2 = 12.71 each side.
    assert figures["tpu.rollout.heavy.async_over_sync"] == 3.0
    assert figures["tpu.rollout.heavy.async_over_sync_ci_low"] == pytest.approx(3.0 - 12.71, abs=0.01)
    assert figures["tpu.rollout.heavy.async_over_sync_trajectories"] == 1.0
    assert figures["tpu.rollout.heavy.useful_samples_per_hour_async"] == pytest.approx((20 + 40 + 99) / 3)
    # v0 per seed: 10, 30 and 25 points; spread 20.
    assert figures["tpu.ablation.v0_pts_spread"] == 20.0 and figures["tpu.ablation.v0_pts_min"] == 10.0


def test_seeds_are_a_count_or_an_inclusive_range() -> None:
    assert seed_range("3") == (0, 1, 2)
    assert seed_range("3..4") == (3, 4)
    for bad in ("0", "4..3", "x", "-1..2"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_range(bad)


def fake_runs(monkeypatch: pytest.MonkeyPatch, ran: list[str]) -> None:
    """Campaigns replaced by records of what would have run (the ledger's bookkeeping is what is tested)."""
    monkeypatch.setattr(tpu_ablation, "_warm_start", lambda scratch, shared, log: ran.append(f"base{shared.seed}"))
    monkeypatch.setattr(tpu_ablation, "run_colocated_warmup", lambda *a, **k: ran.append("compile"))

    def arm(scratch: Path, base: Store, shared: Any, arm: str, *, profile: str, curve: bool,
            log: Any) -> tuple[dict, None]:
        ran.append(f"{shared.seed}/{arm}/{profile}" + ("" if curve else " (v0 and last scored)"))
        return {"final_success": 0.5, "curve": [[0, 0.0, 0.0], [2, 10.0, 0.5]], "wall_s": 10.0, "command_s": 12.0,
                "chip_busy": 0.5, "traj_per_hour": 100.0, "useful_samples_per_hour": 50.0,
                "host_idle_share": 0.1}, None

    monkeypatch.setattr(tpu_ablation, "run_arm", arm)


def test_a_ledger_runs_only_what_it_lacks_and_a_changed_recipe_starts_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    fake_runs(monkeypatch, ran)
    path = tmp_path / "ledger.json"
    ctx = BenchContext(quick=False, plot_dir=tmp_path, scratch=tmp_path, progress=lambda _: None, seeds=(0,))
    ledger = tpu_ablation.Ledger.load(path, fingerprint="f1", device="chip", log=print)
    tpu_ablation.run_ledger(ctx, ledger, ["sync", "eta4"], (0,))
    # The profiles' runs measure throughput: only the campaign's own evaluations score them, no curve.
    assert ran == ["base0", "compile", "0/sync/heavy", "0/eta4/heavy", "0/sync/none (v0 and last scored)",
                   "0/eta4/none (v0 and last scored)", "0/sync/light (v0 and last scored)",
                   "0/eta4/light (v0 and last scored)"]
    ran.clear()
    again = tpu_ablation.Ledger.load(path, fingerprint="f1", device="chip", log=print)
    tpu_ablation.run_ledger(ctx, again, ["sync", "eta2", "eta4"], (0, 1))  # only what seed 0 lacks, then seed 1
    # The claims' arms over both seeds first, then eta2.
    assert ran == ["base1", "compile", "1/sync/heavy", "1/eta4/heavy", "base0", "0/eta2/heavy", "1/eta2/heavy"]
    assert sorted(json.loads(path.read_text())["runs"]) == ["0", "1"]
    lines: list[str] = []
    fresh = tpu_ablation.Ledger.load(path, fingerprint="f2", device="chip", log=lines.append)
    assert fresh.runs == {} and (tmp_path / "ledger-f1.json").exists() and "starting a new ledger" in lines[0]


def test_a_run_its_command_never_finished_is_run_again_and_stays_on_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    fake_runs(monkeypatch, ran)
    finishing = tpu_ablation.run_arm

    def killed_at_eta4(scratch: Path, base: Store, shared: Any, arm: str, *, profile: str, curve: bool,
                       log: Any) -> Any:
        if arm == "eta4":
            raise RuntimeError("the command's limit")  # what a kill leaves: the ledger as saved before the run
        return finishing(scratch, base, shared, arm, profile=profile, curve=curve, log=log)

    monkeypatch.setattr(tpu_ablation, "run_arm", killed_at_eta4)
    path = tmp_path / "ledger.json"
    ctx = BenchContext(quick=False, plot_dir=tmp_path, scratch=tmp_path, progress=lambda _: None, seeds=(0,))
    with pytest.raises(RuntimeError):
        tpu_ablation.run_ledger(ctx, tpu_ablation.Ledger.load(path, fingerprint="f", device="chip", log=print),
                                ["sync", "eta4"], (0,))
    left = json.loads(path.read_text())
    assert sorted(left["runs"]["0"]) == ["sync"] and left["running"]["arm"] == "eta4"
    fake_runs(monkeypatch, ran)  # the next command's run finishes
    ran.clear()
    again = tpu_ablation.Ledger.load(path, fingerprint="f", device="chip", log=print)
    tpu_ablation.run_ledger(ctx, again, ["sync", "eta4"], (0,))
    assert ran[:3] == ["base0", "compile", "0/eta4/heavy"]  # run again, from a warm start of its own
    saved = json.loads(path.read_text())
    assert sorted(saved["runs"]["0"]) == ["eta4", "sync"] and saved["running"] is None
    [attempt] = saved["interrupted"]
    assert (attempt["seed"], attempt["arm"], attempt["profile"]) == (0, "eta4", "heavy")
    assert tpu_ablation.interrupted_notes(again).startswith(
        "Interrupted before they finished (run again by a later command; the attempt is not in the figures): seed 0 "
        "eta4 (heavy latency), started 20")


def finished(final: float, at: str, **more: Any) -> dict[str, Any]:
    return {"final_success": final, "finished_at": f"2026-12-07T{at}+00:00", **more}


def test_merging_a_copy_adds_its_runs_and_keeps_the_first_finished_of_a_run_measured_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tpu_ablation.Ledger(tmp_path / "mine.json", "f", "chip", runs={
        0: {"sync": finished(0.7, "10:00:00")}, 2: {"eta1": finished(0.45, "16:15:00")}})
    mine.save()
    # A command that started from an older copy (seed 2 unknown to it) ran seed 2's eta1 again, which stalled, then
    # was killed during eta2; it also measured a profile run this ledger lacks.
    copy = tpu_ablation.Ledger(tmp_path / "copy.json", "f", "chip", runs={
        0: {"sync": finished(0.7, "10:00:00")}, 2: {"eta1": finished(0.0, "16:22:00", steps=6, stalled="waited")}},
        profiles={"none": {"sync": finished(0.6, "16:30:00")}},
        running={"seed": 2, "arm": "eta2", "profile": "heavy", "started_at": "2026-12-07T16:22:42"})
    copy.save()
    assert tpu_ablation.main(["merge", str(copy.path), "--into", str(mine.path)]) == 0
    merged = tpu_ablation.Ledger.load(mine.path, fingerprint="f", device="chip", log=print)
    assert merged.runs[2]["eta1"]["final_success"] == 0.45  # first to finish, though the repeat differs
    assert merged.runs[0]["sync"]["finished_at"] == "2026-12-07T10:00:00+00:00"  # the same run: no repeat
    assert merged.profiles == {"none": {"sync": finished(0.6, "16:30:00")}}
    [repeat] = merged.repeats
    assert (repeat["seed"], repeat["arm"], repeat["run"]["final_success"]) == (2, "eta1", 0.0)
    [attempt] = merged.interrupted  # the copy's run under way when its command ended
    assert (attempt["seed"], attempt["arm"], attempt["started_at"]) == (2, "eta2", "2026-12-07T16:22:42")
    assert "3 change(s)" in capsys.readouterr().out
    assert tpu_ablation.repeat_notes(merged) == (
        "Run again by a command that started from an older copy of the ledger (the first to finish is in the figures, "
        "whatever either scored; the repeat is not): seed 2 eta1 (heavy latency), finished "
        "2026-12-07T16:22:00+00:00: final 0.0, stalled after step 6. ")
    # Merging the same copy again changes nothing; a copy whose run finished first replaces the one held.
    assert merged.merge(tpu_ablation.Ledger.load(copy.path, fingerprint="f", device="chip", log=print)) == []
    earlier = tpu_ablation.Ledger(tmp_path / "e.json", "f", "chip", runs={2: {"eta1": finished(0.3, "09:00:00")}})
    [line] = merged.merge(earlier)
    assert "seed 2 eta1: run twice; the first to finish counts (2026-12-07T09:00:00+00:00, final 30.0%)" in line
    assert merged.runs[2]["eta1"]["final_success"] == 0.3
    assert [r["run"]["final_success"] for r in merged.repeats] == [0.0, 0.45]


def test_merging_refuses_a_copy_of_another_recipe_and_leaves_both_files_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tpu_ablation.Ledger(tmp_path / "mine.json", "f1", "chip", runs={0: {"sync": finished(0.7, "10:00:00")}})
    mine.save()
    copy = tpu_ablation.Ledger(tmp_path / "copy.json", "f2", "chip", runs={0: {"eta4": finished(0.6, "11:00:00")}})
    copy.save()
    before = mine.path.read_text()
    with pytest.raises(SystemExit):
        tpu_ablation.main(["merge", str(copy.path), "--into", str(mine.path)])
    err = capsys.readouterr().err
    assert "copy.json was measured with recipe f2 on 'chip'" in err and "not one ablation" in err
    assert mine.path.read_text() == before and copy.path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.json", "mine.json"]
    with pytest.raises(SystemExit):
        tpu_ablation.main(["merge", str(tmp_path / "missing.json"), "--into", str(mine.path)])
    assert "no ledger at" in capsys.readouterr().err


def test_a_budget_leaves_the_runs_it_cannot_afford_for_a_later_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    fake_runs(monkeypatch, ran)
    clock = iter(range(0, 10_000, 40))  # every call to the clock is 40 s later: each part "takes" 40 s
    monkeypatch.setattr(tpu_ablation.time, "monotonic", lambda: float(next(clock)))
    ctx = BenchContext(quick=False, plot_dir=tmp_path, scratch=tmp_path, progress=lambda _: None, budget_s=150.0)
    ledger = tpu_ablation.Ledger.load(tmp_path / "l.json", fingerprint="f", device="chip", log=print)
    skipped = tpu_ablation.run_ledger(ctx, ledger, ["sync", "eta4"], (0,))
    assert ran[:2] == ["base0", "compile"] and len(ran) < 8 and skipped
    assert set(ledger.runs.get(0, {})) | {f"{p}:{a}" for p, arms in ledger.profiles.items() for a in arms} == {
        r.split("/")[1] if r.endswith("heavy") else f"{r.split('/')[2].split()[0]}:{r.split('/')[1]}"
        for r in ran[2:]}


def test_a_runs_cost_counts_its_evaluations_after_the_campaign() -> None:
    # What the budget plans with: the whole run as timed, else the campaign's command plus every evaluation (the
    # curve's come after command_s ends); a run recorded before either has only its command.
    assert tpu_ablation.run_cost({"command_s": 80.0, "eval_s": 48.0, "run_s": 112.5}) == 112.5
    assert tpu_ablation.run_cost({"command_s": 80.0, "eval_s": 48.0}) == 128.0
    assert tpu_ablation.run_cost({"command_s": 80.0}) == 80.0


def test_chip_busy_is_the_union_of_the_chosen_processes_chip_spans_in_the_window() -> None:
    def span(process: str, ts: int, dur: int, track: str = "chip") -> dict[str, Any]:
        return {"type": "span", "process": process, "name": "device", "track": track, "ts_us": ts, "dur_us": dur}

    records = [span("rollout-w0", 0, 10), span("rollout-w0", 5, 10), span("trainer", 20, 10),
               span("evaluate", 32, 5), span("trainer", 35, 10), span("trainer", 0, 40, track="trainer")]
    # [0, 15) + [20, 30) + [35, 40) of a 40 µs window: evaluate's span and the non-chip track left out.
    assert chip_busy(records, 0, 40, processes=("rollout", "trainer")) == pytest.approx(30 / 40)
    # Every process: evaluate's [32, 37) joins the trainer's [35, 40) into [32, 40).
    assert chip_busy(records, 0, 40) == pytest.approx(33 / 40)
    with pytest.raises(ValueError, match="empty window"):
        chip_busy(records, 5, 5)


def test_busy_spans_merge_intervals_closer_than_the_gap_onto_the_recorders_clock(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    with telemetry.recording(store, "rollout-w0", sample_every_s=None):
        now = telemetry.now()
        assert now is not None
        spans = telemetry.BusySpans(clock=lambda: 100.0, gap_s=0.01)  # its clock reads 100 when the recorder's reads now
        spans.add(90.0, 91.0)
        spans.add(91.005, 92.0)  # within the gap: one span
        spans.add(95.0, 96.0)
        spans.flush()
    chip = [r for r in read_records(store) if r["track"] == "chip"]
    assert [(r["name"], r["tags"]["calls"]) for r in chip] == [("device", 2), ("device", 1)]
    shift = now - 100.0
    assert chip[0]["ts_us"] == pytest.approx((90.0 + shift) * 1e6, abs=5e4)
    assert chip[0]["dur_us"] == pytest.approx(2e6, abs=1)


def test_quick_ablation_runs_sync_and_eta4_colocated_on_the_cpu_and_resumes_from_its_ledger(tmp_path: Path) -> None:
    lines: list[str] = []
    ctx = BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path / "scratch", progress=lines.append)
    ctx.scratch.mkdir()
    result = tpu_ablation.ablation(ctx, device="cpu", ledger_path=tmp_path / "ledger.json")
    runs = json.loads((tmp_path / "ledger.json").read_text())["runs"]["0"]
    assert sorted(runs) == ["eta4", "sync"]
    for figures in runs.values():
        assert figures["steps"] == 2 and figures["curve"][0][:2] == [0, 0.0]
        assert 0.0 < figures["chip_busy"] <= 1.0 and figures["trajectories"] > 0
        # Its versions' evaluations: at two steps the curve's versions (v0, v2) are the campaign's own, scored inside
        # the command.
        assert 0.0 < figures["eval_s"] < figures["command_s"]
        assert figures["run_s"] >= figures["command_s"]  # the whole run, what follows the campaign included
        # A quick run has no compile warm-up: its trainer's window holds compilations, heard and counted (the five
        # most frequent functions named).
        assert figures["compiles"] >= sum(figures["compiled"].values()) > 0 and figures["compile_s"] > 0
        assert len(figures["compiled"]) <= 5
        # Every run keeps its episodes per behaviour version, from v0 on; the rollout counted every one written.
        by_version = figures["episodes_by_version"]
        assert "v0" in by_version and 0 < sum(v["episodes"] for v in by_version.values()) <= figures["trajectories"]
    assert result.figures["tpu.ablation.sync.seeds"] == 1.0
    assert (tmp_path / "tpu_ablation_curves.png").stat().st_size > 0
    assert (tmp_path / "tpu_ablation_seeds.png").stat().st_size > 0 and "tpu_ablation_seeds.png" in result.plots
    assert (tmp_path / "tpu_trace_heavy_seed0_eta4.json.gz").exists() and (tmp_path / "tpu_chip_timeline.png").exists()
    lines.clear()
    again = tpu_ablation.ablation(ctx, device="cpu", ledger_path=tmp_path / "ledger.json")
    assert not any("warm start" in line for line in lines)  # nothing left to run
    assert again.figures == result.figures


def test_a_config_fingerprint_ignores_a_field_that_sets_nothing_and_changes_with_what_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tpu_ablation.shared_config(quick=True, seed=0)
    base = tpu_ablation.config_fingerprint(config)
    to_dict = type(config).to_dict

    def with_field(value: Any) -> str:  # the same config as if a later version had added one more field
        monkeypatch.setattr(type(config), "to_dict", lambda self: {**to_dict(self), "added": {"inner": value}})
        try:
            return tpu_ablation.config_fingerprint(config)
        finally:
            monkeypatch.setattr(type(config), "to_dict", to_dict)

    assert with_field({}) == with_field(None) == with_field([]) == base
    assert with_field(1) != base
    assert tpu_ablation.config_fingerprint(config.with_overrides({"env.options": {"operand_digits": 1}})) != base
    assert tpu_ablation.config_fingerprint(config.with_overrides({"sft.error_rate": 0.5})) != base


@pytest.mark.cpu_only  # where there is an accelerator, the benchmark runs on it
def test_without_an_accelerator_only_a_ledger_of_this_recipe_with_runs_is_rendered(tmp_path: Path) -> None:
    plots = tmp_path / "bench"
    plots.mkdir()
    ctx = BenchContext(quick=False, plot_dir=plots, scratch=tmp_path, progress=lambda _: None)
    path = tmp_path / tpu_ablation.LEDGER
    with pytest.raises(BenchSkipped):  # no ledger at all: nothing measured anywhere
        tpu_ablation.bench_tpu_ablation(ctx)
    current = tpu_ablation.fingerprint(quick=False)
    for recipe, runs, why in (("0123456789abcdef", {}, "was measured with another recipe"),
                              (current, {}, "holds no run of this recipe yet")):
        path.write_text(json.dumps({"device": "chip", "fingerprint": recipe, "runs": runs, "profiles": {}}))
        with pytest.raises(BenchSkipped, match=why):
            tpu_ablation.bench_tpu_ablation(ctx)
    arms = {arm: {"final_success": 0.5, "v0_success": 0.25, "curve": [[0, 0.0, 0.25], [16, 60.0, 0.5]], "wall_s": 60.0,
                  "command_s": 70.0, "chip_busy": 0.5, "traj_per_hour": 100.0, "useful_samples_per_hour": 50.0,
                  "host_idle_share": 0.1} for arm in ("sync", "eta4")}
    path.write_text(json.dumps({"device": "chip", "fingerprint": current, "runs": {"0": arms}, "profiles": {}}))
    result = tpu_ablation.bench_tpu_ablation(ctx)
    assert result.notes.startswith("Rendered from the ledger on a machine without an accelerator: every figure was "
                                   "measured on chip.")
    assert result.figures["tpu.ablation.v0_pts"] == 25.0 and result.labels == {"tpu.ablation.device": "chip"}


def test_a_stalled_run_counts_with_what_it_reached_and_the_arm_counts_its_stalls() -> None:
    stalled = {**run(0.2, [[0, 0.0, 0.1], [2, 30.0, 0.2]], wall_s=120.0), "stalled": "waited 90.0s"}
    runs = {0: {"sync": run(0.7), "eta4": run(0.7)}, 1: {"sync": run(0.7), "eta4": stalled}}
    figures, claims, _ = ablation_figures(runs, ["sync", "eta4"], prefix="x.")
    assert figures["x.eta4.stalled"] == 1.0 and figures["x.sync.stalled"] == 0.0
    # Gaps 0 and 50 points: the stall is an outcome of the arm, not a missing seed.
    assert figures["x.eta4_gap_pts"] == 25.0 and figures["x.eta4.final_pts_min"] == 20.0
    # It never reached the target (0.63): censored at the 120 s it ran; sync reached it at 50 s.
    assert figures["x.eta4_time_to_target_censored"] == 1.0 and not claims[1].supported


def test_throughput_leaves_a_stalled_run_out_and_the_notes_name_it_with_what_its_policy_did(tmp_path: Path) -> None:
    def arms(useful: float, **eta4: Any) -> dict[str, dict[str, Any]]:
        common = {"traj_per_hour": 100.0, "chip_busy": 0.5, "host_idle_share": 0.5, "wall_s": 10.0,
                  "v0_success": 0.25, "final_success": 0.5, "steps": 16}
        return {"sync": {**common, "useful_samples_per_hour": 10.0},
                "eta4": {**common, "useful_samples_per_hour": useful, **eta4}}

    by_version = {"v2": {"episodes": 96, "reward_mean": 0.23, "tokens_mean": 121.0, "logprob_per_token": -0.31,
                         "statuses": {"ok": 96}},
                  "v3": {"episodes": 880, "reward_mean": 0.0, "tokens_mean": 256.0, "logprob_per_token": -4.5,
                         "statuses": {"max_tokens": 880}}}
    ledger = tpu_ablation.Ledger(tmp_path / "l.json", "f", "chip", runs={
        0: arms(30.0), 1: arms(1.0, stalled="waited", steps=6, episodes_by_version=by_version)})
    figures = tpu_ablation.throughput_figures(ledger)
    assert figures["tpu.rollout.heavy.async_over_sync"] == 3.0  # seed 0 alone: seed 1's eta4 stalled
    assert figures["tpu.rollout.heavy.useful_samples_per_hour_async"] == 30.0
    assert figures["tpu.rollout.heavy.useful_samples_per_hour_sync"] == 10.0  # sync of seed 1 did not stall
    assert "eta4 50.0 (stalled after step 6)" in tpu_ablation.per_seed(ledger)
    assert tpu_ablation.stall_notes(ledger) == (
        "Stalled (the trainer waited 90 s for a group to learn from; counted in the claims with what they reached, "
        "left out of throughput): seed 1 eta4 after step 6 (v2: 96 episodes, reward 0.23, 121 tokens, logprob "
        "-0.31 a token; v3: 880 episodes, reward 0.00, 256 tokens, logprob -4.50 a token). ")


def test_an_arm_whose_trainer_stalls_is_recorded_with_its_published_versions_scored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Episodes cut at 96 tokens (the prompt and about 20 more) have no room for the two tool calls a right answer
    # needs: every group scores 0 alike, the trainer skips them all and stalls after STALL_S, as a collapsed
    # policy's does.
    monkeypatch.setattr(tpu_ablation, "STALL_S", 3.0)
    shared = tpu_ablation.shared_config(quick=True, seed=0, profile="none").with_overrides(
        {"trainer.skip_zero_advantage": True, "rollout.max_tokens": 96})
    base = tpu_ablation._warm_start(tmp_path / "seed0", shared, lambda _: None)
    lines: list[str] = []
    figures, store = tpu_ablation.run_arm(tmp_path / "seed0", base, shared, "eta4", profile="none", log=lines.append)
    assert "waited" in figures["stalled"] and "all-equal rewards (mean 0.00)" in figures["stalled"]
    assert any(line.startswith("tpu_ablation: eta4 stalled after step 0 (v0)") for line in lines)
    assert figures["steps"] == 0 and figures["final_success"] == figures["v0_success"] == 0.0
    assert [point[:2] for point in figures["curve"]] == [[0, 0.0]]  # v0, scored after the stall
    assert figures["wall_s"] >= 3.0
    v0 = figures["episodes_by_version"]["v0"]
    assert v0["reward_mean"] == 0.0 and v0["tokens_mean"] <= 96 and v0["episodes"] == sum(v0["statuses"].values())
    # The engine's logprob of what it sampled, per generated token: negative, finite.
    assert -20.0 < v0["logprob_per_token"] < 0.0
    # The last version's first two episodes, decoded after their prompt: what the policy wrote.
    assert len(v0["sample"]) == 2 and all(0 < len(text) <= tpu_ablation.SAMPLE_CHARS for text in v0["sample"])
