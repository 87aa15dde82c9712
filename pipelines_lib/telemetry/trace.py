"""Read a campaign's telemetry and export it: Perfetto/Chrome JSON traces and metric summaries."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from pipelines_lib.storage.store import Store


def read_records(store: Store) -> list[dict[str, Any]]:
    records = []
    for name in store.list("telemetry"):
        if name.endswith(".jsonl"):
            records.extend(json.loads(line) for line in store.read(f"telemetry/{name}").decode().splitlines() if line)
    return sorted(records, key=lambda r: r["ts_us"])


def to_chrome_trace(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Chrome trace-event JSON (what ui.perfetto.dev opens): one pid per process, one tid per track."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    events: list[dict[str, Any]] = []
    for r in records:
        pid = pids.setdefault(r["process"], len(pids) + 1)
        if r["type"] == "span":
            tid = tids.setdefault((r["process"], r["track"]), len(tids) + 1)
            events.append({"name": r["name"], "ph": "X", "ts": r["ts_us"], "dur": r["dur_us"], "pid": pid, "tid": tid,
                           "args": r.get("tags", {})})
        elif r["type"] == "gauge":
            events.append({"name": r["name"], "ph": "C", "ts": r["ts_us"], "pid": pid, "args": {"value": r["value"]}})
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}} for name, pid in pids.items()]
    meta += [{"name": "thread_name", "ph": "M", "pid": pids[p], "tid": tid, "args": {"name": track}}
             for (p, track), tid in tids.items()]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per span name: count, total/mean/p95 seconds; per gauge: last, mean, max."""
    spans: dict[str, list[float]] = defaultdict(list)
    gauges: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r["type"] == "span":
            spans[f"{r['process'].split('-')[0]}.{r['name']}"].append(r["dur_us"] / 1e6)
        elif r["type"] == "gauge":
            gauges[f"{r['process'].split('-')[0]}.{r['name']}"].append(r["value"])
    out: dict[str, Any] = {}
    for name, d in sorted(spans.items()):
        d_sorted = sorted(d)
        out[f"span.{name}"] = {"count": len(d), "total_s": round(sum(d), 4), "mean_s": round(statistics.fmean(d), 6),
                               "p95_s": round(d_sorted[min(len(d) - 1, int(0.95 * len(d)))], 6)}
    for name, v in sorted(gauges.items()):
        out[f"gauge.{name}"] = {"last": v[-1], "mean": round(statistics.fmean(v), 4), "max": max(v)}
    return out
