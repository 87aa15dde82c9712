"""Read a campaign's telemetry and export it: Perfetto/Chrome JSON traces, a format check, metric summaries.

The trace is Chrome's JSON trace-event format, which ui.perfetto.dev and Perfetto's trace processor import:
one pid per recorder process (``rollout-w0``, ``trainer``), one tid per track (``slot-003``, ``weights``),
spans as complete events (``ph: X``, tags as args), gauges and count totals as counters (``ph: C``), names
as metadata events (``ph: M``). Perfetto draws a thread as one stack and drops X events that overlap without
nesting (its FAQ: "events are only allowed to perfectly nest"), so spans of one track that overlap are split
across extra lanes (``slot-003 #1``). ``check_trace`` applies those rules, for use where Perfetto's own trace
processor (a native binary fetched at run time) is not available.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import NotAnObjectError, NotFoundError, json_problem
from pipelines_lib.storage.store import Store

_log = logging.getLogger(__name__)


_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "span": {"process": str, "name": str, "track": str, "ts_us": int, "dur_us": int},
    "gauge": {"process": str, "name": str, "ts_us": int, "value": (int, float)},
    "count": {"process": str, "name": str, "ts_us": int, "value": (int, float)},
}


def record_problem(record: Any) -> str | None:
    """Why a parsed telemetry line is not a record this module can use (None: it is)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    fields = _FIELDS.get(record.get("type"))  # type: ignore[arg-type]
    if fields is None:
        return f"unknown record type {record.get('type')!r}"
    for key, kind in fields.items():
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"{key!r} is {value!r}"
    return None


def read_records(store: Store, *, on_skip: Callable[[str], None] = _log.warning) -> list[dict[str, Any]]:
    """Every record of ``telemetry/*.jsonl``, by time. A line that does not parse into a record (a process killed
    mid-write leaves a truncated one) or an object that cannot be read is skipped and reported to ``on_skip``."""
    records = []
    for name in store.list(layout.TELEMETRY):
        if not name.endswith(".jsonl"):
            continue
        path = layout.telemetry_file(name)
        try:
            data = store.read(path)
        except (NotFoundError, NotAnObjectError) as e:
            on_skip(f"skipped {store.uri(path)}: {e}")
            continue
        for i, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                problem = record_problem(record)
            except (ValueError, RecursionError) as e:
                problem = f"not JSON ({json_problem(e)})"
            if problem is None:
                records.append(record)
            else:
                on_skip(f"skipped {store.uri(path)} line {i}: {problem}")
    return sorted(records, key=lambda r: r["ts_us"])


STAGE_PROCESSES = {"collect": "rollout", "train": "trainer"}
"""Stage -> the name its recorder's process starts with, where it differs from the stage's name."""


def select(records: list[dict[str, Any]], *, stages: list[str] | None = None, since_us: int | None = None,
           until_us: int | None = None) -> list[dict[str, Any]]:
    """The records of ``stages`` (every stage when None) that overlap ``[since_us, until_us]`` (epoch µs; a
    span counts when any part of it falls inside)."""
    prefixes = [STAGE_PROCESSES.get(s, s) for s in stages] if stages else None

    def wanted(r: dict[str, Any]) -> bool:
        if prefixes is not None and not any(r["process"] == p or r["process"].startswith(f"{p}-")
                                            for p in prefixes):
            return False
        end = r["ts_us"] + r.get("dur_us", 0)
        return (since_us is None or end >= since_us) and (until_us is None or r["ts_us"] <= until_us)

    return [r for r in records if wanted(r)]


def parse_when(text: str, start_us: int) -> int:
    """A ``--since``/``--until`` value as epoch µs: seconds after ``start_us`` (``90``, ``2.5``) or an ISO time
    (``2026-12-02T10:15:00``, UTC unless it names a zone)."""
    try:
        return start_us + round(float(text) * 1e6)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither seconds after the first record nor an ISO time") from None
    return round((when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp() * 1e6)


def _lanes(spans: list[dict[str, Any]]) -> list[int]:
    """Lane of each span (same order) such that the spans of one lane nest: first lane that fits, greedily."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i]["ts_us"], -spans[i]["dur_us"]))
    stacks: list[list[int]] = []  # per lane, the end times of its open spans
    lane = [0] * len(spans)
    for i in order:
        start, end = spans[i]["ts_us"], spans[i]["ts_us"] + spans[i]["dur_us"]
        for stack in stacks:
            while stack and stack[-1] <= start:
                stack.pop()
        k = next((k for k, stack in enumerate(stacks) if not stack or end <= stack[-1]), len(stacks))
        if k == len(stacks):
            stacks.append([])
        stacks[k].append(end)
        lane[i] = k
    return lane


def to_chrome_trace(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Chrome trace-event JSON (what ui.perfetto.dev opens): one pid per process, one tid per track lane."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    by_track: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    events: list[dict[str, Any]] = []
    for r in records:
        pid = pids.setdefault(r["process"], len(pids) + 1)
        if r["type"] == "span":
            by_track[(r["process"], r["track"])].append(r)
        elif r["type"] in ("gauge", "count"):
            events.append({"name": r["name"], "ph": "C", "ts": r["ts_us"], "pid": pid, "args": {"value": r["value"]}})
    for (process, track), spans in by_track.items():
        for r, lane in zip(spans, _lanes(spans), strict=True):
            name = track if lane == 0 else f"{track} #{lane}"
            tid = tids.setdefault((process, name), len(tids) + 1)
            events.append({"name": r["name"], "ph": "X", "ts": r["ts_us"], "dur": r["dur_us"], "pid": pids[process],
                           "tid": tid, "args": r.get("tags", {})})
    # A parent opening in the same µs as its child must come first: importers stack X events in file order.
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}} for name, pid in pids.items()]
    meta += [{"name": "thread_name", "ph": "M", "pid": pids[p], "tid": tid, "args": {"name": track}}
             for (p, track), tid in tids.items()]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def check_trace(trace: dict[str, Any]) -> list[str]:
    """Problems that would make Perfetto's JSON importer drop or misplace events (empty: none).

    The rules of the trace-event format as Perfetto reads it: a ``traceEvents`` list; every event has a string
    ``name``, a known ``ph`` and integer ``pid``; X events have integer ``tid``, ``ts`` and ``dur`` >= 0 and
    an object ``args``, and those of one (pid, tid) nest perfectly; C events have numeric args; M events
    name a process or thread of the trace with a string; every pid and (pid, tid) used is named once.
    """
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    problems: list[str] = []
    named: dict[tuple[str, int, int | None], int] = defaultdict(int)
    used_pids: set[int] = set()
    used_tids: set[tuple[int, int]] = set()
    slices: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for i, e in enumerate(events):
        where = f"event {i} ({e.get('name')!r}, ph={e.get('ph')!r})"
        if not isinstance(e.get("name"), str) or not isinstance(e.get("pid"), int):
            problems.append(f"{where}: name must be a string and pid an integer")
            continue
        ph = e.get("ph")
        if ph == "M":
            kind = {"process_name": "process", "thread_name": "thread"}.get(e["name"])
            if kind is None or not isinstance(e.get("args", {}).get("name"), str):
                problems.append(f"{where}: metadata must be process_name/thread_name with a string args.name")
                continue
            named[(kind, e["pid"], e.get("tid") if kind == "thread" else None)] += 1
        elif ph == "X":
            ts, dur, tid = e.get("ts"), e.get("dur"), e.get("tid")
            if not all(isinstance(v, int) for v in (ts, dur, tid)) or ts < 0 or dur < 0:
                problems.append(f"{where}: ts, dur and tid must be integers, ts and dur >= 0")
                continue
            if not isinstance(e.get("args", {}), dict):
                problems.append(f"{where}: args must be an object")
            used_pids.add(e["pid"])
            used_tids.add((e["pid"], tid))
            slices[(e["pid"], tid)].append((ts, ts + dur, e["name"]))
        elif ph == "C":
            args = e.get("args")
            if (not isinstance(e.get("ts"), int) or not isinstance(args, dict) or not args
                    or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in args.values())):
                problems.append(f"{where}: a counter needs an integer ts and numeric args")
            used_pids.add(e["pid"])
        else:
            problems.append(f"{where}: unsupported phase")
    for key, n in named.items():
        if n > 1:
            problems.append(f"{key[0]} {key[1:]} is named {n} times")
    problems += [f"process {pid} has no process_name" for pid in sorted(used_pids) if ("process", pid, None) not in named]
    problems += [f"thread {key} has no thread_name" for key in sorted(used_tids) if ("thread", *key) not in named]
    for key, spans in slices.items():
        stack: list[tuple[int, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack and end > stack[-1][0]:
                problems.append(f"thread {key}: {name!r} [{start}, {end}) overlaps {stack[-1][1]!r} without nesting")
            stack.append((end, name))
    return problems


def chip_busy(records: list[dict[str, Any]], start_us: int, end_us: int, *,
              processes: tuple[str, ...] | None = None) -> float:
    """Share of ``[start_us, end_us)`` during which some device program had results a host thread was waiting
    for: the union of the ``chip`` track's spans (the engines' merged calls and the trainer's steps, see the
    package docstring) of ``processes`` (stage prefixes, ``("rollout", "trainer")``; None: every process),
    clipped to the window. Overlaps count once: on one chip XLA runs one program at a time, so two users waiting
    at once means one of them queues behind the other."""
    if end_us <= start_us:
        raise ValueError(f"chip_busy: empty window [{start_us}, {end_us})")
    spans = sorted((max(start_us, r["ts_us"]), min(end_us, r["ts_us"] + r["dur_us"])) for r in records
                   if r["type"] == "span" and r["track"] == "chip"
                   and (processes is None or r["process"].split("-")[0] in processes))
    busy, reach = 0, start_us
    for start, end in spans:
        if end > max(start, reach):
            busy += end - max(start, reach)
            reach = end
    return busy / (end_us - start_us)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per span name: count, total/mean/p95 seconds; per gauge: last, mean, max; per count: the total.

    Names are prefixed by the stage (``rollout-w0`` -> ``rollout``); a count total is the sum over the stage's
    processes of each one's last total."""
    spans: dict[str, list[float]] = defaultdict(list)
    gauges: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        key = f"{r['process'].split('-')[0]}.{r['name']}"
        if r["type"] == "span":
            spans[key].append(r["dur_us"] / 1e6)
        elif r["type"] == "gauge":
            gauges[key].append(r["value"])
        elif r["type"] == "count":
            counts[key][r["process"]] = r["value"]
    out: dict[str, Any] = {}
    for name, d in sorted(spans.items()):
        d_sorted = sorted(d)
        out[f"span.{name}"] = {"count": len(d), "total_s": round(sum(d), 4), "mean_s": round(statistics.fmean(d), 6),
                               "p95_s": round(d_sorted[min(len(d) - 1, int(0.95 * len(d)))], 6)}
    for name, v in sorted(gauges.items()):
        out[f"gauge.{name}"] = {"last": v[-1], "mean": round(statistics.fmean(v), 4), "max": max(v)}
    for name, per_process in sorted(counts.items()):
        out[f"count.{name}"] = {"total": sum(per_process.values())}
    return out
