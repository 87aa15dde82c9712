"""Tail committed shards in a version window, hand out whole groups, and resume exactly from a cursor.

The streaming trainer calls ``next_groups(n, min_version=V-η, max_version=V)``. The tailer lists only the
``trajectories/v…`` folders inside that window (bounded listing), walks their shards in name order (versions
ascending, then worker, then seq: deterministic for a fixed set of shards) and returns up to ``n`` whole
groups, remembering how many rows of a partly consumed shard it has handed out.

``cursor`` is everything needed to continue: the trainer saves ``cursor.to_json()`` in the checkpoint of the
step that consumed the groups, and a tailer built from it hands out exactly the groups that follow. Read-ahead
never leaks into the cursor.

Nothing is skipped silently: an unreadable, foreign or invalid shard becomes a ``TailEvent`` of kind
``skipped`` with the reason; when the window moves past a version, its groups not yet handed out become
``dropped_stale`` events. Events are drained by the caller (the trainer writes them into its consumption
log), and the cursor keeps running totals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.shards import ShardError, read_shard
from pipelines_lib.storage.store import Store


@dataclass(frozen=True, kw_only=True)
class GroupSlice:
    """One whole group: rows ``[row_start, row_end)`` of shard ``shard``."""

    shard: str
    version: int
    row_start: int
    row_end: int
    group_id: str
    table: pa.Table


@dataclass(frozen=True, kw_only=True)
class TailEvent:
    kind: str
    """``skipped`` (unreadable/invalid shard) or ``dropped_stale`` (window moved past its version)."""
    shard: str
    reason: str
    groups: tuple[str, ...] = ()


@dataclass
class TailCursor:
    """Serialisable progress of a tailer. Versions below ``retired_below`` are never listed again."""

    done: dict[int, list[str]] = field(default_factory=dict)
    """version -> names of shards fully handed out (or skipped), per live version."""
    partial: dict[str, int] = field(default_factory=dict)
    """shard path -> rows handed out so far."""
    retired_below: int = 0
    groups_consumed: int = 0
    groups_dropped_stale: int = 0
    shards_skipped: int = 0

    def to_json(self) -> str:
        return json.dumps({
            "done": {str(v): sorted(names) for v, names in sorted(self.done.items())},
            "partial": dict(sorted(self.partial.items())),
            "retired_below": self.retired_below,
            "groups_consumed": self.groups_consumed,
            "groups_dropped_stale": self.groups_dropped_stale,
            "shards_skipped": self.shards_skipped,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TailCursor:
        try:
            raw = json.loads(text)
            return cls(
                done={int(v): list(names) for v, names in raw["done"].items()},
                partial={str(k): int(n) for k, n in raw["partial"].items()},
                retired_below=int(raw["retired_below"]),
                groups_consumed=int(raw["groups_consumed"]),
                groups_dropped_stale=int(raw["groups_dropped_stale"]),
                shards_skipped=int(raw["shards_skipped"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a rollstream tail cursor: {e!r}") from e


def _group_runs(table: pa.Table) -> list[tuple[int, int, str]]:
    """Contiguous row ranges of each group (the writer stores a group's rows together)."""
    ids = table.column("group_id").to_pylist()
    runs: list[tuple[int, int, str]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            runs.append((start, i, ids[start]))
            start = i
    return runs


class ShardTailer:
    def __init__(self, store: Store, *, cursor: TailCursor | None = None, validate: bool = True) -> None:
        self.store = store
        self.cursor = cursor or TailCursor()
        self.validate = validate
        self._tables: dict[str, pa.Table] = {}
        self._events: list[TailEvent] = []

    def drain_events(self) -> list[TailEvent]:
        events, self._events = self._events, []
        return events

    def _load(self, path: str) -> pa.Table | None:
        if path not in self._tables:
            try:
                self._tables[path] = read_shard(self.store, path, validate=self.validate)[0]
            except (ShardError, StorageError) as e:
                self._events.append(TailEvent(kind="skipped", shard=path, reason=str(e)))
                self.cursor.shards_skipped += 1
                return None
        return self._tables[path]

    def _finish(self, version: int, path: str) -> None:
        self.cursor.done.setdefault(version, []).append(path.rsplit("/", 1)[-1])
        self.cursor.partial.pop(path, None)
        self._tables.pop(path, None)

    def _pending(self, version: int) -> list[str]:
        done = set(self.cursor.done.get(version, ()))
        folder = layout.version_dir(version)
        return [f"{folder}/{n}" for n in self.store.list(folder)
                if n not in done and layout.parse_shard_path(f"{folder}/{n}") is not None]

    def retire_below(self, min_version: int) -> None:
        """Versions older than ``min_version`` are too stale: account their remaining groups as dropped."""
        for version in range(self.cursor.retired_below, min_version):
            for path in self._pending(version):
                table = self._load(path)
                if table is not None:
                    start = self.cursor.partial.get(path, 0)
                    groups = tuple(g for s, _, g in _group_runs(table) if s >= start)
                    if groups:
                        self._events.append(TailEvent(kind="dropped_stale", shard=path, groups=groups,
                                                      reason=f"version {version} < window start {min_version}"))
                        self.cursor.groups_dropped_stale += len(groups)
                self.cursor.partial.pop(path, None)
                self._tables.pop(path, None)
            self.cursor.done.pop(version, None)
        self.cursor.retired_below = max(self.cursor.retired_below, min_version)

    def next_groups(self, max_groups: int, *, min_version: int, max_version: int) -> list[GroupSlice]:
        """Up to ``max_groups`` whole groups from versions ``[min_version, max_version]``, in order."""
        if max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        self.retire_below(min_version)
        out: list[GroupSlice] = []
        for version in range(max(min_version, self.cursor.retired_below), max_version + 1):
            for path in self._pending(version):
                if len(out) == max_groups:
                    return out
                table = self._load(path)
                if table is None:
                    self._finish(version, path)
                    continue
                start = self.cursor.partial.get(path, 0)
                for s, e, gid in _group_runs(table):
                    if s < start:
                        continue
                    if len(out) == max_groups:
                        return out
                    out.append(GroupSlice(shard=path, version=version, row_start=s, row_end=e, group_id=gid,
                                          table=table.slice(s, e - s)))
                    self.cursor.partial[path] = e
                    self.cursor.groups_consumed += 1
                self._finish(version, path)
        return out
