"""Lightweight RL telemetry: spans, gauges and counters, written to the campaign folder, exported to Perfetto.

A stage opens a ``Recorder`` at its edge (``with recording(store, "rollout-w0"):``); code anywhere below
records through the module functions ``span``, ``gauge`` and ``count``, which find the active recorder in
a ``ContextVar`` and do nothing when none is active (tests and REPL use cost nothing). Records are kept in
memory and appended to ``telemetry/<track>-<nonce>-<seq>.jsonl`` objects (create-only) on ``flush``.

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

from pipelines_lib.storage.store import Store

_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("rollstream_recorder", default=None)
_TRACK: contextvars.ContextVar[str | None] = contextvars.ContextVar("rollstream_track", default=None)


class Recorder:
    """Collects records of one process/stage. Thread-safe; timestamps are wall-clock microseconds."""

    def __init__(self, store: Store | None, process: str, *, clock: Callable[[], float] = time.time,
                 flush_every: int = 5000) -> None:
        self.store = store
        self.process = process
        self.clock = clock
        self.flush_every = flush_every
        self._nonce = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._seq = 0
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.totals: dict[str, float] = {}

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.records.append(record)
            full = len(self.records) >= self.flush_every
        if full:
            self.flush()

    def span_record(self, name: str, track: str, start_s: float, end_s: float, tags: dict[str, Any]) -> None:
        self.add({"type": "span", "name": name, "process": self.process, "track": track,
                  "ts_us": int(start_s * 1e6), "dur_us": max(0, int((end_s - start_s) * 1e6)), "tags": tags})

    def flush(self) -> str | None:
        """Write what is buffered as one create-only JSONL object; returns its path."""
        with self._lock:
            records, self.records = self.records, []
            seq, self._seq = self._seq, self._seq + 1
        if not records or self.store is None:
            return None
        path = f"telemetry/{self.process}-{self._nonce}-{seq:05d}.jsonl"
        self.store.create(path, "".join(json.dumps(r, default=str) + "\n" for r in records).encode())
        return path


@contextlib.contextmanager
def recording(store: Store | None, process: str, **kwargs: Any) -> Iterator[Recorder]:
    """Activate a recorder for the code inside (and tasks it spawns); flushes on exit."""
    recorder = Recorder(store, process, **kwargs)
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
        recorder.flush()


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


@contextlib.contextmanager
def span(name: str, *, track: str | None = None, **tags: Any) -> Iterator[None]:
    """Time the enclosed code (awaits included) as one span on ``track``.

    The track defaults to the one set by ``on_track``, else the span's name. Spans on one track must nest
    (the trace format draws a track as a stack), which one episode per slot track guarantees.
    """
    recorder = _ACTIVE.get()
    if recorder is None:
        yield
        return
    start = recorder.clock()
    try:
        yield
    finally:
        recorder.span_record(name, track or _TRACK.get() or name, start, recorder.clock(), tags)


def gauge(name: str, value: float, **tags: Any) -> None:
    recorder = _ACTIVE.get()
    if recorder is not None:
        recorder.add({"type": "gauge", "name": name, "process": recorder.process, "ts_us": int(recorder.clock() * 1e6),
                      "value": float(value), "tags": tags})


def count(name: str, inc: float = 1.0) -> None:
    recorder = _ACTIVE.get()
    if recorder is not None:
        with recorder._lock:
            recorder.totals[name] = recorder.totals.get(name, 0.0) + inc
