"""The in-memory channel: groups kept in this process, no encoding and no storage (``channel`` has the contract).

Writers buffer and commit exactly as ``ShardWriter`` does (``GroupBuffer``: the same names, sequence numbers
and acknowledgements), but a commit appends the Arrow table to the channel. A reader walks the commits of the
window's versions in name order and moves a ``TailCursor`` the way ``ShardTailer`` does, so its cursor means the
same thing; there is nothing to list, decode or screen for damage, and nothing can be copied, so a group is
kept out only for what the trainer cannot train on (``trainable``), as a ``skipped`` event.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

import pyarrow as pa

from pipelines_lib.storage import layout
from pipelines_lib.trajectory.channel import GroupSlice, WriterConfig
from pipelines_lib.trajectory.cursor import TailCursor, TailEvent
from pipelines_lib.trajectory.trainable import TrainerNeeds, group_problem, group_runs, infra_problem
from pipelines_lib.trajectory.window import Window
from pipelines_lib.trajectory.writer import GroupBuffer

Commit = tuple[layout.ShardId, pa.Table, list[tuple[int, int, str]]]
"""A committed shard: its name, its rows and its groups' row ranges."""


class MemoryChannel:
    """Shards of whole groups held in memory, by version; thread-safe between writers and readers."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._commits: dict[int, list[Commit]] = defaultdict(list)

    def writer(self, worker_id: str, config: WriterConfig | None = None) -> MemoryWriter:
        return MemoryWriter(self, worker_id=worker_id, config=config, clock=self._clock)

    def reader(self, cursor: TailCursor | None = None, needs: TrainerNeeds | None = None) -> MemoryReader:
        return MemoryReader(self, cursor=cursor, needs=needs)

    def put(self, sid: layout.ShardId, table: pa.Table) -> None:
        runs, _ = group_runs(table)  # a GroupBuffer commits whole groups, one run each
        with self._lock:
            if not any(c[0] == sid for c in self._commits[sid.version]):  # a retried commit that landed
                self._commits[sid.version].append((sid, table, runs))
                self._commits[sid.version].sort(key=lambda c: c[0])

    def commits(self, version: int) -> list[Commit]:
        with self._lock:
            return list(self._commits.get(version, ()))

    def committed_groups(self, worker: str) -> set[str]:
        with self._lock:
            return {gid for commits in self._commits.values() for sid, _, runs in commits
                    if sid.worker_id.startswith(f"{worker}.") for *_, gid in runs}


class MemoryWriter(GroupBuffer):
    def __init__(self, channel: MemoryChannel, *, worker_id: str, config: WriterConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(worker_id=worker_id, config=config, clock=clock)
        self._channel = channel

    def _put(self, sid: layout.ShardId, table: pa.Table) -> int:
        self._channel.put(sid, table)
        return table.nbytes


class MemoryReader:
    def __init__(self, channel: MemoryChannel, *, cursor: TailCursor | None = None,
                 needs: TrainerNeeds | None = None) -> None:
        self._channel = channel
        self.cursor = cursor or TailCursor()
        self.needs = needs
        self._events: list[TailEvent] = []

    def drain_events(self) -> list[TailEvent]:
        events, self._events = self._events, []
        return events

    def reread(self, shard: str, row_start: int, row_end: int) -> pa.Table:
        sid = layout.parse_shard_path(shard)
        for committed, table, _ in self._channel.commits(sid.version) if sid is not None else ():
            if committed == sid:
                return table.slice(row_start, row_end - row_start)
        raise KeyError(f"memory channel: no committed shard {shard!r}")

    def next_groups(self, max_groups: int, window: Window) -> list[GroupSlice]:
        if max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        self._retire(window)
        out: list[GroupSlice] = []
        for version in range(max(window.start, self.cursor.retired_below), window.version + 1):
            for sid, table, runs in self._channel.commits(version):
                if self.cursor.is_done(sid):
                    continue
                start = self.cursor.partial.get(sid.path, 0)
                for s, e, gid in runs:
                    if s < start:
                        continue
                    if len(out) == max_groups:
                        return out
                    self.cursor.partial[sid.path] = e
                    self._hand_out(out, sid, table.slice(s, e - s), s, gid, window)
                self._finish(sid)
        return out

    def _hand_out(self, out: list[GroupSlice], sid: layout.ShardId, rows: pa.Table, start: int, gid: str,
                  window: Window) -> None:
        problem = ((self.needs and group_problem(rows, self.needs, folder_version=sid.version,
                                                 newest_version=window.version)) or infra_problem(rows))
        if problem:
            self._events.append(TailEvent(kind="skipped", shard=sid.path, reason=problem, groups=(gid,)))
            self.cursor.groups_skipped += 1
            return
        out.append(GroupSlice(shard=sid.path, version=sid.version, row_start=start, row_end=start + rows.num_rows,
                              group_id=gid, table=rows))
        self.cursor.groups_consumed += 1

    def _finish(self, sid: layout.ShardId) -> None:
        marks = self.cursor.marks.setdefault(sid.version, {})
        marks[sid.worker_id] = max(marks.get(sid.worker_id, -1), sid.seq)
        self.cursor.partial.pop(sid.path, None)

    def _retire(self, window: Window) -> None:
        """Groups of versions the window moved past, not handed out, become ``dropped_stale`` events."""
        for version in range(self.cursor.retired_below, window.start):
            for sid, _, runs in self._channel.commits(version):
                start = self.cursor.partial.pop(sid.path, 0)
                groups = tuple(gid for s, _, gid in runs if s >= start)
                if not self.cursor.is_done(sid) and groups:
                    self._events.append(TailEvent(kind="dropped_stale", shard=sid.path, groups=groups,
                                                  reason=window.stale_reason(version)))
                    self.cursor.groups_dropped_stale += len(groups)
            self.cursor.marks.pop(version, None)
        self.cursor.retired_below = max(self.cursor.retired_below, window.start)
