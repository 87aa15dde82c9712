"""The audit's worker processes: version folders (``unit.Unit``) audited on up to ``jobs`` long-lived
``python -m pipelines_lib.audit.worker`` processes, a unit at a time each, answering in JSON.

``results`` is what ``campaign.audit_campaign`` calls: ``(unit, result)`` in the order units were given, a kept
result passed through, the others audited in this process (``jobs`` = 1) or on workers. At most ``2 * jobs``
results wait to be merged, so memory stays bounded. Every wait on a worker has a deadline (``timeout_s``); a
worker that dies, overruns or fails stops the audit with an ``AuditWorkerError`` naming the folder, and a storage
failure it reports is raised here as the ``StorageError`` it was.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipelines_lib
from pipelines_lib.audit.unit import Unit
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store

WORKER_COMMAND = ("-m", "pipelines_lib.audit.worker")
"""Arguments to the interpreter that start a worker process."""
WORKER_EXIT_S = 10.0
"""How long a worker may take to exit once its input closes (or once it closed its output) before it is killed."""


class AuditWorkerError(RuntimeError):
    """A worker process died, overran ``unit_timeout_s`` or failed on a version folder; the message names it."""


class _Worker:
    """One worker process (``python -m pipelines_lib.audit.worker``) and the unit it is auditing, if any."""

    def __init__(self) -> None:
        # Started in the folder that holds this package: ``-m`` imports this very code, whatever the caller's
        # working directory (units name their campaign by absolute URL).
        self.proc = subprocess.Popen([sys.executable, *WORKER_COMMAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=Path(pipelines_lib.__file__).resolve().parents[1])
        self.unit: Unit | None = None
        self.deadline = 0.0
        self._buffer = bytearray()

    def start(self, unit: Unit, timeout_s: float) -> None:
        self.unit, self.deadline = unit, time.monotonic() + timeout_s
        try:
            self.proc.stdin.write(json.dumps(unit.to_plain(), separators=(",", ":")).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None

    def _died(self) -> AuditWorkerError:
        try:
            code = self.proc.wait(timeout=WORKER_EXIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        unit = self.unit
        return AuditWorkerError(f"audit worker {self.proc.pid} exited with code {code} while auditing "
                                f"{unit.folder} ({len(unit.shards)} shards) of {unit.url}" if unit else
                                f"audit worker {self.proc.pid} exited with code {code}")

    def read(self) -> dict[str, Any] | None:
        """What is readable of the answer now: the unit's result once the whole line is in, else None."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not chunk:
            raise self._died()
        self._buffer += chunk
        if not self._buffer.endswith(b"\n"):
            return None
        answer, unit = json.loads(self._buffer), self.unit
        self._buffer.clear()
        self.unit = None
        if "storage" in answer:
            op, url, detail = answer["storage"]
            raise StorageError(op, url, f"{detail} (auditing {unit.folder})")
        if "error" in answer:
            raise AuditWorkerError(f"audit worker {self.proc.pid} failed on {unit.folder} ({len(unit.shards)} "
                                   f"shards) of {unit.url}: {answer['error']}")
        return answer["result"]

    def close(self, kill: bool) -> None:
        if kill:
            self.proc.kill()
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=WORKER_EXIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


@dataclass
class _Slot:
    unit: Unit
    result: dict[str, Any] | None


def _on_workers(units: Iterator[tuple[Unit, dict[str, Any] | None]], jobs: int,
                timeout_s: float) -> Iterator[tuple[Unit, dict[str, Any]]]:
    """``(unit, result)`` in the order of ``units``, each unit given without a result (None) audited on one of up to
    ``jobs`` workers (started as needed); at most ``2 * jobs`` results wait to be merged (bounded memory)."""
    workers: list[_Worker] = []
    window: deque[_Slot] = deque()
    slot_of: dict[int, _Slot] = {}
    clean = False
    try:
        nxt = next(units, None)
        while True:
            while nxt is not None and len(window) < 2 * jobs:
                unit, result = nxt
                slot = _Slot(unit=unit, result=result)
                if result is None:
                    idle = next((w for w in workers if w.unit is None), None)
                    if idle is None and len(workers) < jobs:
                        idle = _Worker()
                        workers.append(idle)
                    if idle is None:
                        break
                    idle.start(unit, timeout_s)
                    slot_of[idle.proc.pid] = slot
                window.append(slot)
                nxt = next(units, None)
            if not window:
                clean = True
                return
            if window[0].result is not None:
                slot = window.popleft()
                yield slot.unit, slot.result
                continue
            busy = [w for w in workers if w.unit is not None]
            first = min(busy, key=lambda w: w.deadline)
            with selectors.DefaultSelector() as sel:
                for w in busy:
                    sel.register(w.proc.stdout, selectors.EVENT_READ, w)
                ready = sel.select(timeout=max(0.0, first.deadline - time.monotonic()))
            if not ready and time.monotonic() >= first.deadline:
                raise AuditWorkerError(f"audit worker {first.proc.pid} did not finish {first.unit.folder} "
                                       f"({len(first.unit.shards)} shards) of {first.unit.url} within "
                                       f"{timeout_s:.0f} s")
            for key, _ in ready:
                worker: _Worker = key.data
                if (result := worker.read()) is not None:
                    slot_of.pop(worker.proc.pid).result = result
    finally:
        for w in workers:
            w.close(kill=not clean)


SHARDS_PER_WORKER = 1000
"""Shards to audit that one more worker process must have to pay for itself. Starting a worker (an interpreter
importing Arrow and the decoding code) costs seconds, decoding a shard milliseconds: on 2 CPU cores over
``bench.storage_scale`` campaigns, two workers caught up with one process only at thousands of shards."""


def auto_jobs(shards: int, cpus: int) -> int:
    """How many processes audit ``shards`` shards on ``cpus`` CPUs: 1 (this process, no workers) unless each worker
    gets at least ``SHARDS_PER_WORKER`` shards, and never more workers than CPUs."""
    return max(1, min(cpus, shards // SHARDS_PER_WORKER))


def _sized(units: Iterator[tuple[Unit, dict[str, Any] | None]], cpus: int
           ) -> tuple[int, Iterator[tuple[Unit, dict[str, Any] | None]]]:
    """``auto_jobs`` for ``units``, and the same units: only as many folders are listed ahead as it takes to see
    enough shards to audit for one worker per CPU (or all of them, in a smaller campaign)."""
    ahead: list[tuple[Unit, dict[str, Any] | None]] = []
    shards = 0
    while shards < SHARDS_PER_WORKER * cpus and (nxt := next(units, None)) is not None:
        ahead.append(nxt)
        shards += len(nxt[0].shards) if nxt[1] is None else 0
    return auto_jobs(shards, cpus), itertools.chain(ahead, units)


def results(store: Store, units: Iterator[tuple[Unit, dict[str, Any] | None]], jobs: int | None, timeout_s: float,
            on_shards: Callable[[int], None]) -> Iterator[tuple[Unit, dict[str, Any]]]:
    """``(unit, result)`` in order: a given result (kept from an earlier audit) as it is, the others audited here
    (``jobs`` = 1: the decoding code is imported only then) or on workers; ``jobs`` None chooses by the campaign's
    size (``auto_jobs``). ``on_shards(n)`` follows progress: per shard here, per unit from workers and kept
    results."""
    if jobs is None:
        jobs, units = _sized(units, os.cpu_count() or 1)
    if jobs == 1:
        from pipelines_lib.audit.worker import audit_unit

        for unit, result in units:
            if result is None:
                yield unit, audit_unit(unit, store, on_shards)
            else:
                on_shards(len(unit.shards))
                yield unit, result
        return
    for unit, result in _on_workers(units, jobs, timeout_s):
        on_shards(len(unit.shards))
        yield unit, result

