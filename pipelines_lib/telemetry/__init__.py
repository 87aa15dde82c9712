"""Lightweight RL telemetry: spans, gauges and counters, written to the campaign folder, exported to Perfetto.

A stage opens a ``Recorder`` at its edge (``with recording(store, "rollout-w0"):``); code anywhere below
records through the module functions ``span``, ``record_span``, ``gauge`` and ``count``, which find the
active recorder in a ``ContextVar`` and do nothing when none is active (tests and REPL use cost nothing).
Records are kept in memory and appended to ``telemetry/<process>-<nonce>-<seq>.jsonl`` objects (create-only)
on ``flush``; each flush also writes the running ``count`` totals (status counts, the staleness histogram).
While recording, a sampler thread records the process's resident memory (``rss_mb``) every
``sample_every_s``; ``samplers.ThroughputGauges`` turns an engine's cumulative counters into interval gauges.

Where the spans of a rollout worker come from::

    rollout-w0 (process)
      slot-003 (track: on_track, set per episode slot by the orchestrator)
        episode ─┬─ env_reset                 run_episode (agents/episode.py)
                 ├─ generate ─ queue_wait     (queue_wait: the engine's slot queue, when it reports one)
                 ├─ tool_call.<tool>          laid out after the call from the tools' own latencies
                 └─ env_step / reward         env.step; ``reward`` when it ends the episode
      weights, writer (tracks): weight_swap, admission_wait, backpressure_wait, shard_flush, commit_hold (a
        finished group held until its version is stored: rollout.swap_at_hand_over)
      counters: episodes_in_flight, group_queue_depth, engine_*, trajectories_per_s, rss_mb, status.* totals,
        groups_unstored
    trainer (process)
      trainer (track): data_wait, train_step, publish, checkpoint
      counters: trainer_version, dropped_stale_groups, staleness.* totals, rss_mb
    chip (track, in either process): ``device`` spans, the intervals a device program of that process had
      results the host was waiting for (the engine's calls, merged by ``BusySpans``; the trainer's steps):
      ``trace.chip_busy`` unions them into the share of wall clock the accelerator was working

``trace.to_chrome_trace`` turns the records of any campaign into the Chrome/Perfetto JSON trace format
(one process per stage, one thread per track, complete events ``ph: X`` with tags as args, counters as
``ph: C``), which ui.perfetto.dev opens directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.telemetry.tensorboard import event_file

_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("rollstream_recorder", default=None)
_TRACK: contextvars.ContextVar[str | None] = contextvars.ContextVar("rollstream_track", default=None)
_ENCODER = json.JSONEncoder(default=str)  # one encoder: json.dumps(..., default=str) builds one per call


class Recorder:
    """Collects records of one process/stage. Thread-safe; timestamps are wall-clock microseconds."""

    FLUSH_EVERY = 5000
    """Records per JSONL object by default: a few hundred kB, one create per few seconds of a busy worker."""

    def __init__(self, store: Store | None, process: str, *, clock: Callable[[], float] = time.time,
                 flush_every: int = FLUSH_EVERY) -> None:
        self.store = store
        self.process = process
        self.clock = clock
        self.flush_every = flush_every
        self._nonce = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._seq = 0
        self._t0_us = int(clock() * 1e6)
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.totals: dict[str, float] = {}
        self.flush_in_background = False
        """Set while a sampler thread flushes full buffers, so that recording never blocks on storage."""

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.records.append(record)
            full = len(self.records) >= self.flush_every
        if full and not self.flush_in_background:
            self.flush()

    def span_record(self, name: str, track: str, start_s: float, end_s: float, tags: dict[str, Any]) -> None:
        # Both ends are truncated to whole µs, so a span ending when the next one starts never overlaps it.
        start_us = int(start_s * 1e6)
        self.add({"type": "span", "name": name, "process": self.process, "track": track,
                  "ts_us": start_us, "dur_us": max(0, int(end_s * 1e6) - start_us), "tags": tags})

    def gauge_record(self, name: str, value: float, tags: dict[str, Any]) -> None:
        self.add({"type": "gauge", "name": name, "process": self.process, "ts_us": int(self.clock() * 1e6),
                  "value": float(value), "tags": tags})

    def flush(self) -> str | None:
        """Write what is buffered, then the running count totals, as one create-only JSONL object; returns its path."""
        with self._lock:
            ts_us = int(self.clock() * 1e6)
            records, self.records = self.records, []
            records += [{"type": "count", "name": name, "process": self.process, "ts_us": ts_us, "value": total}
                        for name, total in sorted(self.totals.items())]
            seq, self._seq = self._seq, self._seq + 1
        if not records or self.store is None:
            return None
        path = layout.telemetry_file(f"{self.process}-{self._nonce}-{seq:05d}.jsonl")
        self.store.create(path, "".join(_ENCODER.encode(r) + "\n" for r in records).encode())
        # The same gauges for TensorBoard; x is the gauge's ``step`` tag (trainer step, evaluated version), else
        # seconds since the recorder started.
        if gauges := [r for r in records if r["type"] == "gauge"]:
            scalars = [(r["name"], step if isinstance(step := r["tags"].get("step"), int)
                        else (r["ts_us"] - self._t0_us) // 10**6, r["value"], r["ts_us"] / 1e6) for r in gauges]
            self.store.create(layout.tensorboard_file(self.process, f"{ts_us // 10**6}.{self._nonce}-{seq:05d}"),
                              event_file(scalars, wall_time=ts_us / 1e6))
        return path


def rss_mb() -> float:
    """Resident memory of this process in MiB."""
    return psutil.Process().memory_info().rss / 2**20


@contextlib.contextmanager
def recording(store: Store | None, process: str, *, sample_every_s: float | None = 1.0,
              **kwargs: Any) -> Iterator[Recorder]:
    """Activate a recorder for the code inside (and tasks it spawns); flushes on exit.

    When the code inside raises, its exception propagates even if the flush fails too (a storage outage fails
    both): the flush's error is attached to it as a note.

    ``sample_every_s``: period of the ``rss_mb`` gauge, sampled by a thread so that a stage blocked in
    compute is still sampled; the same thread writes a full buffer out, off the recording code's path (None:
    no thread; a full buffer is written by the ``add`` that filled it)."""
    recorder = Recorder(store, process, **kwargs)
    token = _ACTIVE.set(recorder)
    stop = threading.Event()
    sampler = None
    if sample_every_s is not None:
        if sample_every_s <= 0:
            raise ValueError(f"recording: sample_every_s must be > 0 or None, got {sample_every_s}")

        def sample() -> None:
            while True:
                recorder.gauge_record("rss_mb", rss_mb(), {})
                if len(recorder.records) >= recorder.flush_every:
                    recorder.flush()
                if stop.wait(sample_every_s):
                    return

        recorder.flush_in_background = True
        sampler = threading.Thread(target=sample, name=f"telemetry-{process}", daemon=True)
        sampler.start()
    error: BaseException | None = None
    try:
        yield recorder
    except BaseException as e:
        error = e
        raise
    finally:
        _ACTIVE.reset(token)
        if sampler is not None:
            stop.set()
            sampler.join()
        try:
            recorder.flush()
        except Exception as flush_error:
            if error is None:
                raise
            # In a storage outage the flush fails as well: the stage must still report what failed first.
            error.add_note(f"telemetry: the flush on exit failed too: {type(flush_error).__name__}: {flush_error}")


def active() -> Recorder | None:
    return _ACTIVE.get()


@contextlib.contextmanager
def on_track(track: str) -> Iterator[None]:
    """Spans opened inside (also in tasks created inside) default to ``track``: one lane per episode slot."""
    token = _TRACK.set(track)
    try:
        yield
    finally:
        _TRACK.reset(token)


class Span:
    """One timed span; ``span`` builds it. Code inside may rename it or add tags known only at the end.

    A class rather than a generator context manager: entering and leaving costs about a microsecond, recorder
    or not, so instrumentation can stay on everywhere."""

    __slots__ = ("name", "tags", "track", "_recorder", "_start")

    def __init__(self, name: str, track: str | None, tags: dict[str, Any]) -> None:
        self.name = name
        self.track = track
        self.tags = tags
        self._recorder: Recorder | None = None
        self._start = 0.0

    def __enter__(self) -> Span:
        recorder = self._recorder = _ACTIVE.get()
        if recorder is not None:
            self.track = self.track or _TRACK.get()
            self._start = recorder.clock()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        if exc_type is not None:
            self.tags["error"] = exc_type.__name__
        recorder.span_record(self.name, self.track or self.name, self._start, recorder.clock(), self.tags)


def span(name: str, *, track: str | None = None, **tags: Any) -> Span:
    """Time the enclosed code (awaits included) as one span on ``track``; an exception is tagged ``error``.

    The track defaults to the one set by ``on_track`` (read on entry), else the span's name. Spans on one track
    should nest (the trace format draws a track as a stack), which one episode per slot track guarantees; the
    exporter moves spans that do not onto extra lanes of their track.
    """
    return Span(name, track, tags)


def now() -> float | None:
    """The active recorder's clock (seconds), None when not recording: anchors spans laid out after the fact."""
    recorder = _ACTIVE.get()
    return None if recorder is None else recorder.clock()


def record_span(name: str, start_s: float, end_s: float, *, track: str | None = None, **tags: Any) -> None:
    """Record a span whose times are already known (on the recorder's clock, see ``now``)."""
    recorder = _ACTIVE.get()
    if recorder is not None:
        recorder.span_record(name, track or _TRACK.get() or name, start_s, end_s, tags)


class BusySpans:
    """A device user's busy intervals recorded as ``device`` spans on the ``chip`` track, intervals less than
    ``gap_s`` apart merged into one span: an engine dispatches a call every few milliseconds, and a span per call
    would outnumber every other record. ``clock`` is the user's own clock (the engine's, injected); a span is
    moved onto the recorder's clock when it is recorded. ``flush`` records the open interval (call it before
    idling and at the end)."""

    def __init__(self, clock: Callable[[], float], *, gap_s: float = 0.002) -> None:
        self._clock = clock
        self._gap_s = gap_s
        self._open: list[float] | None = None
        self._calls = 0

    def add(self, start: float, end: float) -> None:
        if self._open is not None and start <= self._open[1] + self._gap_s:
            self._open[1] = max(self._open[1], end)
        else:
            self.flush()
            self._open = [start, end]
        self._calls += 1

    def flush(self) -> None:
        if self._open is None:
            return
        recorder = _ACTIVE.get()
        if recorder is not None:
            shift = recorder.clock() - self._clock()
            recorder.span_record("device", "chip", self._open[0] + shift, self._open[1] + shift,
                                 {"calls": self._calls})
        self._open, self._calls = None, 0


def gauge(name: str, value: float, **tags: Any) -> None:
    recorder = _ACTIVE.get()
    if recorder is not None:
        recorder.gauge_record(name, value, tags)


def count(name: str, inc: float = 1.0) -> None:
    recorder = _ACTIVE.get()
    if recorder is not None:
        with recorder._lock:
            recorder.totals[name] = recorder.totals.get(name, 0.0) + inc
