"""The channel from rollout to trainer: what a rollout worker writes whole groups to and what the trainer reads
them from, with one contract whatever carries the groups.

```
 orchestrator ── GroupSink.add_group / flush ──►  channel  ──► GroupSource.next_groups(n, Window) ── trainer
   (resume: Channel.committed_groups(worker))                 ├─ drain_events (skipped, dropped_stale), cursor
                                                              └─ reread(shard, rows): a logged group (replay)
```

Backends:

- ``folder``: the campaign folder (``folder.FolderChannel``); ``writer.ShardWriter`` commits create-only Arrow
  shards and ``reader.ShardTailer`` tails them (what campaigns run on: every stage talks through the folder);
- ``memory``: ``memory.MemoryChannel``, groups kept in the process, no encoding, no storage (one-process tools,
  tests and benchmarks of the parts around the channel).

The contract (``tests/test_channel.py`` runs it on every backend): a group is handed out whole, at most once,
in version then commit order and only while inside the window; a group the window moved past becomes a
``dropped_stale`` event with ``Window.stale_reason``; only a flushed group is acknowledged (``ShardInfo``), and
a group acknowledged is never lost; a reader built from another's cursor hands out exactly the groups that
follow; a group handed out can be read again by its address (``GroupSlice.shard`` and rows), which is how the
trainer replays a logged step; a worker's committed groups are listed under its name, whatever its start.

The types both ends and both backends share live here: ``WriterConfig`` (when a sink commits), ``ShardInfo`` (a
commit's acknowledgement) and ``GroupSlice`` (a group handed out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from pipelines_lib.trajectory.cursor import TailCursor, TailEvent
from pipelines_lib.trajectory.record import Trajectory
from pipelines_lib.trajectory.trainable import TrainerNeeds, group_digest
from pipelines_lib.trajectory.window import Window, zero_advantage


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """A committed shard."""

    path: str
    version: int
    worker_id: str
    seq: int
    n_groups: int
    n_rows: int
    n_bytes: int
    group_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class WriterConfig:
    """When the shard writer commits."""

    max_groups: int = 8
    """Commit once this many groups of one version are buffered."""
    max_bytes: int = 32 * 2**20
    """...or once their estimated Arrow size passes this."""
    max_age_s: float = 5.0
    """...or once the oldest buffered group has waited this long (bounds trainer latency on a trickle)."""

    def __post_init__(self) -> None:
        if self.max_groups < 1:
            raise ValueError(f"WriterConfig.max_groups must be >= 1, got {self.max_groups}")
        if self.max_bytes < 1:
            raise ValueError(f"WriterConfig.max_bytes must be >= 1, got {self.max_bytes}")
        if self.max_age_s <= 0:
            raise ValueError(f"WriterConfig.max_age_s must be > 0, got {self.max_age_s}")



@dataclass(frozen=True, kw_only=True)
class GroupSlice:
    """One whole group: rows ``[row_start, row_end)`` of shard ``shard``."""

    shard: str
    version: int
    row_start: int
    row_end: int
    group_id: str
    table: pa.Table

    @property
    def digest(self) -> str:
        """``trainable.group_digest`` of the rows: what the consumption log records of them."""
        return group_digest(self.table)


class GroupSink(Protocol):
    """A rollout worker's end: buffers whole groups and acknowledges them when committed."""

    def add_group(self, group: Sequence[Trajectory]) -> list[ShardInfo]: ...

    def flush_due(self) -> list[ShardInfo]: ...

    def flush(self) -> list[ShardInfo]: ...

    def next_flush_in(self) -> float | None: ...


class GroupSource(Protocol):
    """The trainer's end: whole groups of a window, what it did not hand out, where it is, and a group handed out
    before, read again by its address."""

    cursor: TailCursor

    def next_groups(self, max_groups: int, window: Window) -> list[GroupSlice]: ...

    def drain_events(self) -> list[TailEvent]: ...

    def reread(self, shard: str, row_start: int, row_end: int) -> pa.Table: ...


class Channel(Protocol):
    def writer(self, worker_id: str, config: WriterConfig | None = None) -> GroupSink: ...

    def reader(self, cursor: TailCursor | None = None, needs: TrainerNeeds | None = None) -> GroupSource: ...

    def committed_groups(self, worker: str) -> set[str]:
        """Group ids committed by every start of logical worker ``worker`` (sink names ``<worker>.<nonce>``)."""
        ...


def no_learning_signal(groups: Sequence[GroupSlice]) -> bool:
    """Every group's rewards are all equal: zero advantage, so a step on them has loss and gradient 0."""
    return all(zero_advantage(g.table.column("reward").to_pylist()) for g in groups)
