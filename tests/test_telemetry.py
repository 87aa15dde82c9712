"""Telemetry records through the context, lands in the campaign folder, and exports a valid trace."""

from __future__ import annotations

import asyncio
import json

from pipelines_lib import telemetry
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.trace import read_records, summarize, to_chrome_trace


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_spans_without_a_recorder_cost_nothing_and_record_nothing() -> None:
    with telemetry.span("x"):
        telemetry.gauge("g", 1)
    assert telemetry.active() is None


def test_spans_nest_per_track_and_export_to_chrome_trace(tmp_path) -> None:
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

    with telemetry.recording(store, "rollout-w0", clock=clock):
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
    json.dumps(trace)  # serialisable as-is
    names = {(e["ph"], e["name"]) for e in trace["traceEvents"]}
    assert ("M", "process_name") in names and ("X", "generate") in names and ("C", "episodes_in_flight") in names
    # Per track, complete events nest: each one lies inside or after the previous one.
    by_tid: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], []).append(e)
    for events in by_tid.values():
        stack: list[int] = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1], "overlapping spans on one track"
            stack.append(e["ts"] + e["dur"])
    summary = summarize(records)
    assert summary["span.rollout.tool"] == {"count": 2, "total_s": 0.5, "mean_s": 0.25, "p95_s": 0.25}


def test_trace_and_metrics_commands_read_any_campaign(tmp_path, capsys) -> None:
    from pipelines_lib.cli import main

    store = Store(str(tmp_path / "c"))
    with telemetry.recording(store, "trainer"):
        with telemetry.span("train_step", track="trainer", step=1):
            pass
        telemetry.gauge("trainer_version", 1)
    out = tmp_path / "trace.json"
    assert main(["trace", store.url, "--out", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert any(e["ph"] == "X" and e["name"] == "train_step" and e["args"] == {"step": 1} for e in trace["traceEvents"])
    assert main(["metrics", store.url, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert summary["span.trainer.train_step"]["count"] == 1 and summary["gauge.trainer.trainer_version"]["last"] == 1.0
    assert main(["trace", str(tmp_path / "empty"), "--out", str(out)]) == 2
