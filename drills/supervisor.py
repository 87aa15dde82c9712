"""The kill supervisor: SIGKILL a stage's process at random moments and restart it (``drills/kills.py`` uses it).

``KillDrill`` supervises one subprocess at a time: it starts the stage, waits until the process reports
progress (a ``ready`` line: past start-up and compilation), sleeps a seeded random delay, SIGKILLs it, and
starts it again, ``kills`` times; the last start runs to completion. Every output line is timestamped, so the
**resume gap** (ARCHITECTURE §7) is measured from the kill to the first progress line of the restarted process. Two
hooks time and judge kills by what storage shows: ``arm`` (a probe polled after the ready line; the random delay
starts when it first holds, e.g. while a publication is in flight) and ``inspect`` (run on the campaign after
each killed process is gone, before the restart; its findings stay on the kill's record).
``partial_visible`` is the check every drill runs afterwards: no visible object may fail to read.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import TEMP_MARKER, Store
from pipelines_lib.trajectory.codec import ShardError, read_shard

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class KillRecord:
    kill_at: float
    resumed_at: float | None = None
    found: dict[str, Any] = field(default_factory=dict)
    """What ``KillDrill.inspect`` saw in storage once the killed process was gone."""

    @property
    def gap_s(self) -> float | None:
        return None if self.resumed_at is None else round(self.resumed_at - self.kill_at, 3)


@dataclass
class KillDrill:
    """Start, kill and restart ``argv`` until ``done()``; ``ready`` matches a progress line."""

    argv: Callable[[], list[str]]
    """Command of the next start (it may depend on what is already in storage)."""
    ready: re.Pattern[str]
    done: Callable[[], bool]
    kills: int
    seed: int = 0
    max_delay_s: float = 1.5
    start_timeout_s: float = 600.0
    log: Callable[[str], None] = lambda s: None
    arm: Callable[[], bool] | None = None
    """When set, a start to be killed polls this probe (every ``poll_s``) once it has printed a ready line, and
    the random delay starts when the probe first holds: kills timed to a state visible in storage."""
    poll_s: float = 0.005
    inspect: Callable[[], dict[str, Any]] | None = None
    """Run after each killed process has exited, before the restart; its result is the record's ``found``."""
    records: list[KillRecord] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    starts: int = 0
    completed: bool = False
    """A start after the last kill exited cleanly (the stage finished what it was asked)."""

    def _start(self) -> tuple[subprocess.Popen[str], queue.Queue[tuple[float, str] | None]]:
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        lines: queue.Queue[tuple[float, str] | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put((time.monotonic(), line.rstrip("\n")))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.starts += 1
        return proc, lines

    def run(self) -> list[KillRecord]:
        rng = random.Random(self.seed)
        while not self.done():
            proc, lines = self._start()
            killing = len(self.records) < self.kills
            killed = False
            probing = False  # past the ready line, waiting for ``arm`` to hold
            kill_at: float | None = None
            deadline = time.monotonic() + self.start_timeout_s
            output: list[str] = []
            while True:
                if kill_at is not None and time.monotonic() >= kill_at:
                    # A process that has already exited took no kill: nothing is recorded, and the drill's
                    # result shows fewer kills than asked.
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
                        self.records.append(KillRecord(kill_at=time.monotonic()))
                        self.log(f"kill {len(self.records)}/{self.kills} (start {self.starts})")
                        killed = True
                    kill_at, killing = None, False
                if probing and self.arm is not None and self.arm():
                    probing = False
                    kill_at = time.monotonic() + rng.uniform(0.0, self.max_delay_s)
                wake = kill_at if kill_at is not None else deadline
                if probing:
                    wake = min(wake, time.monotonic() + self.poll_s)
                try:
                    item = lines.get(timeout=max(0.0, wake - time.monotonic()))
                except queue.Empty:
                    if kill_at is not None or (probing and time.monotonic() < deadline):
                        continue
                    proc.kill()
                    raise TimeoutError(f"{self.argv()[:3]}: no progress in {self.start_timeout_s:.0f}s:\n"
                                       + "\n".join(output[-30:])) from None
                if item is None:
                    break
                t, line = item
                deadline = t + self.start_timeout_s  # "no progress" means no output at all for that long
                output.append(line)
                self.lines.append((t, line))
                if self.ready.search(line):
                    last = self.records[-1] if self.records else None
                    if last is not None and last.resumed_at is None:
                        last.resumed_at = t
                    if killing and kill_at is None and not probing:
                        if self.arm is None:
                            kill_at = time.monotonic() + rng.uniform(0.0, self.max_delay_s)
                        else:
                            probing = True
            code = proc.wait(timeout=60)
            if code not in (0, -signal.SIGKILL):
                raise RuntimeError(f"stage process failed with exit code {code}:\n" + "\n".join(output[-40:]))
            if killed and self.inspect is not None:
                self.records[-1].found = self.inspect()
                self.log(f"after kill {len(self.records)}: {self.records[-1].found}")
            self.completed = code == 0 and len(self.records) >= self.kills
        return self.records


# -- shared checks ----------------------------------------------------------------------------------------

def partial_visible(store: Store) -> tuple[int, int, list[str]]:
    """(unreadable visible objects, hidden temporaries, first few bad paths) over the whole campaign."""
    bad: list[str] = []
    orphans = 0
    for rel in store.walk():
        name = rel.rsplit("/", 1)[-1]
        if name.startswith(".") or TEMP_MARKER in name or "orbax-checkpoint-tmp" in rel:
            orphans += name.startswith(".") and TEMP_MARKER in name
            continue
        try:
            if rel.endswith(".arrow") and rel.startswith(layout.TRAJECTORIES):
                read_shard(store, rel)
            elif rel.endswith(".json") or rel.endswith(".jsonl"):
                text = store.read(rel).decode()
                for chunk in (text.splitlines() if rel.endswith(".jsonl") else [text]):
                    json.loads(chunk)
        except (ShardError, ValueError, UnicodeDecodeError) as e:
            bad.append(f"{rel}: {e}")
    return len(bad), orphans, bad[:5]


def resume_gaps(records: list[KillRecord]) -> list[float]:
    """Resume gaps (seconds) of the kills whose restarted process reported progress."""
    return [r.gap_s for r in records if r.gap_s is not None]
