"""Telemetry records through the context, lands in the campaign folder, and exports a trace Perfetto accepts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.engine.scripted import ScriptedEngine
from pipelines_lib.envs import hermes_tool_call
from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.envs.tools.latency import LatencyProfile
from pipelines_lib.model.tokenizer import open_tokenizer
from pipelines_lib.rollout.collect import worker_tasks
from pipelines_lib.rollout.episodes import make_episode_fn
from pipelines_lib.rollout.orchestrator import Orchestrator
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.samplers import ThroughputGauges, interval_gauges
from pipelines_lib.telemetry.tensorboard import event_file, masked_crc32c
from pipelines_lib.telemetry.trace import (
    check_trace,
    parse_when,
    read_records,
    select,
    summarize,
    to_chrome_trace,
)
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.writer import ShardWriter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def x_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def thread_names(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


# -- a real recorded rollout -----------------------------------------------------------------------------------

TOOL_S = 0.03
GENERATE_S = 0.01


@pytest.fixture(scope="module")
def rollout_campaign(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A rollout worker's telemetry: orchestrator, episode runner, calculator env with 30 ms tool latency, and a
    scripted engine (10 ms per call) that calls the calculator once and then answers; 4 groups of 2, 4 in flight."""
    store = Store(str(tmp_path_factory.mktemp("telemetry") / "campaign"))
    base = CampaignConfig.tiny()
    config = dataclasses.replace(
        base, env=EnvSpec(name="arithmetic", tool_latency=LatencyProfile(kind="fixed", value_s=TOOL_S)),
        rollout=dataclasses.replace(base.rollout, group_size=2, max_concurrency=4, target_groups=4,
                                    max_groups_per_version=None, stop_poll_s=0.02, writer=WriterConfig(max_groups=2)))
    tok = open_tokenizer(config.tokenizer)

    def script(prompt: list[int], index: int) -> str:
        called = "<tool_call>" in tok.decode(prompt)
        return "<answer>0</answer>" if called else hermes_tool_call("calculator", {"expression": "2*3"})

    engine = ScriptedEngine(script, tokenizer=tok, max_seq_len=config.engine.max_seq_len, policy_version=3,
                            latency_s=GENERATE_S)
    tasks = worker_tasks(ArithmeticEnv.generate_tasks(seed=0, n=8, split="train"), worker_index=0, num_workers=1,
                         skip=set())
    orchestrator = Orchestrator(config=config.rollout, engine=engine, tasks=tasks,
                                episode_fn=make_episode_fn(config.rollout, config.agent, engine=engine, tokenizer=tok,
                                                           worker_id="w0", tool_latency=config.env.tool_latency),
                                writer=ShardWriter(store, worker_id="w0", config=config.rollout.writer))
    with telemetry.recording(store, "rollout-w0", sample_every_s=0.02):
        stats = asyncio.run(orchestrator.run())
    assert stats.groups_committed == 4 and stats.statuses == {"ok": 8}
    return store


def test_recorded_rollout_trace_follows_perfettos_json_rules(rollout_campaign: Store) -> None:
    trace = to_chrome_trace(read_records(rollout_campaign))
    json.dumps(trace)
    assert check_trace(trace) == []
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert processes == {"rollout-w0"}
    tracks = set(thread_names(trace).values())
    assert {"writer"} <= tracks and {t for t in tracks if t.startswith("slot-")} == {f"slot-00{i}" for i in range(4)}


def test_every_episode_span_names_its_group_version_and_status_and_holds_its_steps(rollout_campaign: Store) -> None:
    trace = to_chrome_trace(read_records(rollout_campaign))
    events = x_events(trace)
    episodes = [e for e in events if e["name"] == "episode" and "status" in e["args"]]  # run_episode's own
    assert len(episodes) == 8
    assert {(e["args"]["group"], e["args"]["sample"]) for e in episodes} == {
        (g, i) for g in {e["args"]["group"] for e in episodes} for i in (0, 1)}
    assert all(e["args"]["version"] == 3 and e["args"]["status"] == "ok" for e in episodes)
    names = {e["name"] for e in events}
    assert {"env_reset", "generate", "tool_call.calculator", "reward", "shard_flush"} <= names
    for e in events:
        if e["name"] in ("generate", "tool_call.calculator", "reward"):
            (parent,) = [p for p in episodes if p["tid"] == e["tid"] and p["ts"] <= e["ts"]
                         and e["ts"] + e["dur"] <= p["ts"] + p["dur"]]
            assert parent["args"]["group"]
    calls = [e for e in events if e["name"] == "tool_call.calculator"]
    assert len(calls) == 8 and all(e["dur"] >= TOOL_S * 1e6 for e in calls)
    assert all(e["args"]["version"] == 3 and e["args"]["tokens"] > 0 for e in events if e["name"] == "generate")


def test_tool_waits_overlap_generation_of_other_episodes(rollout_campaign: Store) -> None:
    events = x_events(to_chrome_trace(read_records(rollout_campaign)))
    calls = [e for e in events if e["name"].startswith("tool_call.")]
    gens = [e for e in events if e["name"] == "generate"]
    overlapping = [(c, g) for c in calls for g in gens
                   if c["tid"] != g["tid"] and c["ts"] < g["ts"] + g["dur"] and g["ts"] < c["ts"] + c["dur"]]
    assert overlapping


def test_rollout_records_throughput_memory_and_status_counts(rollout_campaign: Store) -> None:
    summary = summarize(read_records(rollout_campaign))
    assert summary["count.rollout.status.ok"] == {"total": 8}
    assert summary["gauge.rollout.rss_mb"]["max"] > 10
    assert summary["gauge.rollout.episodes_in_flight"]["max"] == 4
    assert "gauge.rollout.trajectories_per_s" in summary
    assert summary["span.rollout.tool_call.calculator"]["count"] == 8


def _trace_processor_binary() -> str | None:
    return os.environ.get("PERFETTO_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")


@pytest.mark.skipif(_trace_processor_binary() is None,
                    reason="Perfetto's trace processor is a native binary that the `perfetto` package downloads at "
                           "run time (no registry ships it); set PERFETTO_TRACE_PROCESSOR to a local "
                           "trace_processor_shell to run this check")
def test_perfettos_trace_processor_reads_the_recorded_trace(rollout_campaign: Store, tmp_path: Path) -> None:
    tp_api = pytest.importorskip("perfetto.trace_processor", reason="the `perfetto` package is not installed")
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(to_chrome_trace(read_records(rollout_campaign))))
    config = tp_api.TraceProcessorConfig(bin_path=_trace_processor_binary())
    with tp_api.TraceProcessor(trace=str(path), config=config) as tp:
        def rows(sql: str) -> list[Any]:
            return list(tp.query(sql))

        slices = rows("""
            select s.id, s.name, s.ts, s.dur, s.depth, t.name as thread, p.name as process,
                   extract_arg(s.arg_set_id, 'args.group') as grp,
                   extract_arg(s.arg_set_id, 'args.status') as status
            from slice s join thread_track tt on s.track_id = tt.id join thread t using (utid)
            join process p using (upid)""")
        assert {r.process for r in slices} == {"rollout-w0"}
        episodes = [r for r in slices if r.name == "episode" and r.status == "ok"]
        assert len(episodes) == 8 and all(r.grp for r in episodes)
        assert {r.thread for r in episodes} == {f"slot-00{i}" for i in range(4)}
        overlap = rows("""
            select count(*) as n from slice c join thread_track ct on c.track_id = ct.id
            join slice g on g.name = 'generate' join thread_track gt on g.track_id = gt.id
            where c.name glob 'tool_call.*' and ct.utid != gt.utid and c.ts < g.ts + g.dur and g.ts < c.ts + c.dur""")
        assert overlap[0].n > 0
        dropped = rows("select coalesce(sum(value), 0) as n from stats where severity in ('error', 'data_loss')")
        assert dropped[0].n == 0


# -- recorder and exporter -------------------------------------------------------------------------------------

def test_spans_without_a_recorder_cost_nothing_and_record_nothing() -> None:
    with telemetry.span("x") as opened:
        telemetry.gauge("g", 1)
        telemetry.record_span("y", 0.0, 1.0)
    assert telemetry.active() is None and telemetry.now() is None and opened.name == "x"


def test_spans_nest_per_track_and_export_to_chrome_trace(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    clock = Clock()

    async def episode(slot: int) -> None:
        with telemetry.on_track(f"slot-{slot}"), telemetry.span("episode", group="g1"):
            with telemetry.span("generate"):
                clock.t += 0.5
                await asyncio.sleep(0)
            with telemetry.span("tool", tool="calculator"):
                clock.t += 0.25
                await asyncio.sleep(0)

    with telemetry.recording(store, "rollout-w0", clock=clock, sample_every_s=None):
        async def both() -> None:
            await asyncio.wait_for(episode(0), 5)  # sequential: the fake clock is shared
            await asyncio.wait_for(episode(1), 5)

        asyncio.run(both())
        telemetry.gauge("episodes_in_flight", 2)
    records = read_records(store)
    spans = [r for r in records if r["type"] == "span"]
    assert {r["track"] for r in spans} == {"slot-0", "slot-1"}
    tool = next(r for r in spans if r["name"] == "tool")
    assert tool["dur_us"] == 250_000 and tool["tags"] == {"tool": "calculator"}
    trace = to_chrome_trace(records)
    names = {(e["ph"], e["name"]) for e in trace["traceEvents"]}
    assert ("M", "process_name") in names and ("X", "generate") in names and ("C", "episodes_in_flight") in names
    assert check_trace(trace) == []
    summary = summarize(records)
    assert summary["span.rollout.tool"] == {"count": 2, "total_s": 0.5, "mean_s": 0.25, "p95_s": 0.25}


def test_a_span_can_be_renamed_and_tagged_before_it_ends_and_records_the_exception_that_ended_it() -> None:
    clock = Clock()
    with telemetry.recording(None, "rollout-w0", clock=clock, sample_every_s=None) as recorder:
        with telemetry.span("env_step", track="slot-0", turn=1) as step:
            clock.t += 0.002
            step.name, step.tags["reward"] = "reward", 1.0
        with pytest.raises(KeyError), telemetry.span("generate", track="slot-0"):
            raise KeyError("x")
        telemetry.record_span("tool_call.search", 100.0, 100.001, track="slot-0", tool="search")
        reward, failed, tool = recorder.records
    assert (reward["name"], reward["tags"], reward["ts_us"], reward["dur_us"]) == (
        "reward", {"turn": 1, "reward": 1.0}, 100_000_000, 2000)
    assert failed["tags"] == {"error": "KeyError"}
    assert (tool["name"], tool["dur_us"], tool["tags"]) == ("tool_call.search", 1000, {"tool": "search"})


def test_spans_that_overlap_on_one_track_are_moved_to_extra_lanes_that_nest() -> None:
    def span(name: str, ts: int, dur: int) -> dict[str, Any]:
        return {"type": "span", "name": name, "process": "eval", "track": "episode", "ts_us": ts, "dur_us": dur,
                "tags": {}}

    # a [0, 10) holds b [2, 5); c [4, 12) overlaps both; d [10, 11) fits in lane 0 after a ends.
    trace = to_chrome_trace([span("a", 0, 10), span("b", 2, 3), span("c", 4, 8), span("d", 10, 1)])
    assert check_trace(trace) == []
    lanes = thread_names(trace)
    assert {e["name"]: lanes[(e["pid"], e["tid"])] for e in x_events(trace)} == {
        "a": "episode", "b": "episode", "c": "episode #1", "d": "episode"}


def test_check_trace_reports_what_perfetto_would_drop() -> None:
    trace = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p"}},
        {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1, "args": {}},
        {"name": "b", "ph": "X", "ts": 5, "dur": 10, "pid": 1, "tid": 1, "args": {}},
        {"name": "c", "ph": "X", "ts": 1.5, "dur": 1, "pid": 1, "tid": 1},
        {"name": "g", "ph": "C", "ts": 3, "pid": 1, "args": {"value": "high"}},
        {"name": "i", "ph": "q", "ts": 3, "pid": 1},
    ]}
    assert check_trace(trace) == [
        "event 3 ('c', ph='X'): ts, dur and tid must be integers, ts and dur >= 0",
        "event 4 ('g', ph='C'): a counter needs an integer ts and numeric args",
        "event 5 ('i', ph='q'): unsupported phase",
        "thread (1, 1) has no thread_name",
        "thread (1, 1): 'b' [5, 15) overlaps 'a' without nesting",
    ]


def test_count_totals_are_written_on_each_flush_and_summed_over_a_stages_processes(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    for worker, n in (("w0", 3), ("w1", 2)):
        with telemetry.recording(store, f"rollout-{worker}", sample_every_s=None) as recorder:
            for _ in range(n):
                telemetry.count("status.ok")
            recorder.flush()  # a mid-run flush writes the running total; the final one supersedes it
            telemetry.count("status.timeout")
    records = read_records(store)
    assert sorted(r["value"] for r in records if r["name"] == "status.ok") == [2, 2, 3, 3]
    summary = summarize(records)
    assert summary["count.rollout.status.ok"] == {"total": 5} and summary["count.rollout.status.timeout"] == {"total": 2}
    assert check_trace(to_chrome_trace(records)) == []


def test_a_failing_stage_reports_its_own_error_when_the_telemetry_flush_fails_too(tmp_path: Path) -> None:
    # An outage as the filesystem sees it: the campaign folder sits under a regular file, so every create fails.
    (tmp_path / "blocker").write_text("")
    store = Store(str(tmp_path / "blocker" / "campaign"))
    with pytest.raises(StorageError, match=r"^storage create \S+/trajectories/v00000000/w0-00000000.arrow: ") as err, \
            telemetry.recording(store, "rollout-w0", sample_every_s=None):
        telemetry.count("status.ok")  # something to flush
        store.create("trajectories/v00000000/w0-00000000.arrow", b"shard")
    assert len(err.value.__notes__) == 1
    assert err.value.__notes__[0].startswith("telemetry: the flush on exit failed too: StorageError: storage create ")
    assert "/telemetry/rollout-w0-" in err.value.__notes__[0]
    # Nothing else failing, the flush's own error is the stage's error.
    with pytest.raises(StorageError, match=r"^storage create \S+/telemetry/trainer-"), \
            telemetry.recording(store, "trainer", sample_every_s=None):
        telemetry.count("status.ok")


def test_resident_memory_is_sampled_while_recording_even_when_the_stage_blocks() -> None:
    with telemetry.recording(None, "trainer", sample_every_s=0.01) as recorder:
        def rss() -> list[float]:
            return [r["value"] for r in list(recorder.records) if r["name"] == "rss_mb"]

        deadline = time.monotonic() + 60  # a stage stuck outside Python: the sampler thread still records
        while len(rss()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        samples = rss()
    assert len(samples) >= 3 and all(10 < v < 1e6 for v in samples)
    with pytest.raises(ValueError, match="sample_every_s must be > 0 or None, got 0"), telemetry.recording(
            None, "x", sample_every_s=0):
        pass


# -- interval gauges -------------------------------------------------------------------------------------------

def test_interval_gauges_are_the_changes_of_the_engine_counters_over_the_interval() -> None:
    before = {"trajectories": 10, "generated_tokens": 1000, "decode_steps": 100, "active_slot_steps": 800,
              "reused_prefix_tokens": 500, "prefill_tokens": 700, "busy_s": 4.0, "wall_s": 10.0}
    after = {"trajectories": 14, "generated_tokens": 1600, "decode_steps": 150, "active_slot_steps": 1400,
             "reused_prefix_tokens": 800, "prefill_tokens": 800, "busy_s": 5.5, "wall_s": 12.0}
    assert interval_gauges(before, after, 2.0) == {
        "trajectories_per_s": (14 - 10) / 2,            # 2.0
        "engine_tokens_per_s": (1600 - 1000) / 2,       # 300
        "engine_active_slots": (1400 - 800) / (150 - 100),  # 12 slots busy per decode step
        "engine_prefix_reuse": 300 / (300 + 100),       # 0.75 of the admitted prompt tokens came from the cache
        "engine_busy_fraction": (5.5 - 4.0) / (12 - 10),    # 0.75
    }
    # No prompt admitted in the interval: no reuse share to report.
    assert "engine_prefix_reuse" not in interval_gauges(before, {**after, "reused_prefix_tokens": 500,
                                                                 "prefill_tokens": 700}, 2.0)
    # A compute call credited when it returns (a 3 s compilation ending within this 2 s interval) caps at 1.
    assert interval_gauges(before, {**after, "busy_s": 7.0}, 2.0)["engine_busy_fraction"] == 1.0
    assert interval_gauges(after, {**before, "wall_s": 1.0}, 2.0) == {}  # reset_stats() in between
    assert interval_gauges(before, after, 0.0) == {}


def test_throughput_gauges_take_a_baseline_then_record_each_interval() -> None:
    class CountingEngine:
        def __init__(self) -> None:
            self.counters = {"generated_tokens": 0, "decode_steps": 0, "active_slot_steps": 0, "busy_s": 0.0,
                             "wall_s": 0.0}

        def stats(self) -> dict[str, float]:
            return dict(self.counters)

    engine, clock = CountingEngine(), Clock()
    gauges = ThroughputGauges(engine, clock=clock)
    assert gauges.sample(trajectories=0) == {}  # not recording: nothing sampled
    with telemetry.recording(None, "rollout-w0", clock=clock, sample_every_s=None) as recorder:
        assert gauges.sample(trajectories=0) == {}
        clock.t += 0.5
        engine.counters = {"generated_tokens": 200, "decode_steps": 25, "active_slot_steps": 100, "busy_s": 0.25,
                           "wall_s": 0.5}
        assert gauges.sample(trajectories=3) == {"trajectories_per_s": 6.0, "engine_tokens_per_s": 400.0,
                                                 "engine_active_slots": 4.0, "engine_busy_fraction": 0.5}
        assert [r["name"] for r in recorder.records] == [
            "trajectories_per_s", "engine_tokens_per_s", "engine_active_slots", "engine_busy_fraction"]


# -- CLI -------------------------------------------------------------------------------------------------------

def test_trace_and_metrics_commands_read_any_campaign(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines_lib.cli import main

    store = Store(str(tmp_path / "c"))
    with telemetry.recording(store, "trainer", sample_every_s=None):
        with telemetry.span("train_step", track="trainer", step=1):
            pass
        telemetry.gauge("trainer_version", 1)
        telemetry.count("staleness.0")
    out = tmp_path / "trace.json"
    assert main(["trace", store.url, "--out", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert any(e["ph"] == "X" and e["name"] == "train_step" and e["args"] == {"step": 1} for e in trace["traceEvents"])
    assert main(["metrics", store.url, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert summary["span.trainer.train_step"]["count"] == 1 and summary["gauge.trainer.trainer_version"]["last"] == 1.0
    assert summary["count.trainer.staleness.0"] == {"total": 1.0}
    assert main(["metrics", store.url]) == 0
    assert "count.trainer.staleness.0" in capsys.readouterr().out
    assert main(["trace", str(tmp_path / "empty"), "--out", str(out)]) == 2


def _span(process: str, ts_s: float, dur_s: float) -> dict:
    return {"type": "span", "process": process, "name": "x", "track": "t", "ts_us": int(ts_s * 1e6),
            "dur_us": int(dur_s * 1e6)}


def test_select_keeps_the_chosen_stages_and_what_overlaps_the_window() -> None:
    records = [_span("rollout-rollout0", 100, 10), _span("trainer", 105, 1), _span("evaluate", 130, 5),
               _span("warm_start", 50, 40)]
    assert select(records, stages=["collect"]) == records[:1]  # collect records as rollout-<worker>
    assert select(records, stages=["train", "evaluate"]) == records[1:3]
    # [104 s, 112 s]: the rollout span (100-110) and the train step (105-106) overlap it; warm start ended at 90.
    assert select(records, since_us=104_000_000, until_us=112_000_000) == records[:2]


def test_since_and_until_read_seconds_after_the_first_record_or_an_iso_time() -> None:
    start = 1_764_000_000_000_000
    assert parse_when("90", start) == start + 90_000_000 and parse_when("2.5", start) == start + 2_500_000
    assert parse_when("2026-12-02T10:00:00", start) == 1_796_205_600_000_000  # UTC unless it says
    assert parse_when("2026-12-02T11:00:00+01:00", start) == 1_796_205_600_000_000
    with pytest.raises(ValueError, match="neither seconds"):
        parse_when("yesterday", start)


def test_trace_command_filters_by_stage_and_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines_lib.cli import main

    store = Store(str(tmp_path / "c"))
    for process in ("trainer", "evaluate"):
        with telemetry.recording(store, process, sample_every_s=None), telemetry.span(f"{process}_work", track="t"):
            pass
    out = tmp_path / "trace.json"
    assert main(["trace", store.url, "--out", str(out), "--stage", "evaluate"]) == 0
    names = {e["name"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"}
    assert names == {"evaluate_work"}
    assert main(["trace", store.url, "--out", str(out), "--since", "0", "--until", "3600", "--overwrite"]) == 0
    names = {e["name"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"}
    assert names == {"trainer_work", "evaluate_work"}
    assert main(["trace", store.url, "--out", str(out), "--since", "3600", "--overwrite"]) == 2
    assert "no telemetry in the chosen stages and time window" in capsys.readouterr().err
    assert main(["trace", store.url, "--stage", "evaluat"]) == 2
    assert "did you mean 'evaluate'?" in capsys.readouterr().err


# -- benchmark -------------------------------------------------------------------------------------------------

def test_overhead_benchmark_times_both_arms_on_episodes_that_record_six_spans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import telemetry as bench
    from bench.registry import BenchContext

    monkeypatch.setattr(bench, "QUICK", {"episodes": 10, "repeats": 1, "spans": 1000})
    result = bench.bench_telemetry(BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path, progress=print))
    figures = result.figures
    assert figures["telemetry.spans_per_episode"] == 6  # episode, env_reset, generate x2, tool_call, reward
    assert figures["telemetry.span_us"] > 0 and figures["telemetry.episode_ms"] > 0
    off, on = result.rows
    assert (off["arm"], on["arm"]) == ("off", "on")
    # The figure is the recorded arm's time over the bare arm's (minus 1), not a number of its own.
    assert figures["telemetry.overhead_fraction"] == pytest.approx(on["episode ms (p10)"] / off["episode ms (p10)"] - 1)
    assert figures["telemetry.episode_ms"] == pytest.approx(off["episode ms (p10)"])
    cost_us = figures["telemetry.records_per_episode"] * (figures["telemetry.span_us"] + figures["telemetry.span_flush_us"])
    assert figures["telemetry.records_per_episode"] >= 6 and figures["telemetry.episode_cost_us"] == pytest.approx(cost_us)
    assert figures["telemetry.modelled_overhead_fraction"] == pytest.approx(cost_us / (figures["telemetry.episode_ms"] * 1e3))
    assert list((tmp_path / "rep0" / "telemetry").iterdir())  # the recorded arm wrote its JSONL


# -- TensorBoard ---------------------------------------------------------------------------------------------

def _read_tfrecords(data: bytes) -> list[bytes]:
    out = []
    while data:
        (length,), (len_crc,) = struct.unpack("<Q", data[:8]), struct.unpack("<I", data[8:12])
        assert len_crc == masked_crc32c(data[:8])
        body, (crc,) = data[12:12 + length], struct.unpack("<I", data[12 + length:16 + length])
        assert crc == masked_crc32c(body)
        out.append(body)
        data = data[16 + length:]
    return out


def test_masked_crc32c_is_tfrecords_checksum() -> None:
    # CRC-32C("123456789") = 0xE3069283 (the standard check value); masked: rotate right 15, add 0xA282EAD8.
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_an_event_file_holds_the_version_header_then_one_scalar_event_per_gauge() -> None:
    records = _read_tfrecords(event_file([("a", 3, 0.5, 1.0)], wall_time=1.0))
    one = bytes.fromhex("09" "000000000000f03f")  # field 1 (wall_time, double) = 1.0
    assert records[0] == one + bytes.fromhex("1000") + b"\x1a\x0dbrain.Event:2"  # step 0, file_version
    # step 3; summary (field 5) { value (1) { tag (1) "a", simple_value (2, float) 0.5 } }
    assert records[1] == one + bytes.fromhex("1003" "2a0a" "0a08" "0a0161" "150000003f")


def test_a_flush_writes_the_gauges_as_a_tensorboard_run_of_the_process(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    with telemetry.recording(store, "trainer", sample_every_s=None):
        telemetry.gauge("train.loss", 0.25, step=7)
        with telemetry.span("train_step", track="trainer"):
            pass
    (name,) = store.list("telemetry/tb/trainer")
    assert name.startswith("events.out.tfevents.")
    header, scalar = _read_tfrecords(store.read(f"telemetry/tb/trainer/{name}"))
    assert b"brain.Event:2" in header and b"\x10\x07" in scalar and b"train.loss" in scalar
    assert struct.unpack("<f", scalar[-4:]) == (0.25,)
