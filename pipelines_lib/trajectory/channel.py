"""The channel from rollout to trainer: what a rollout worker writes whole groups to and what the trainer reads
them from, with one contract whatever carries the groups.

```
 orchestrator ── GroupSink.add_group / flush ──►  channel  ──► GroupSource.next_groups(n, Window) ── trainer
                                                             └─ drain_events (skipped, dropped_stale), cursor
```

Backends:

- ``folder``: the campaign folder; ``writer.ShardWriter`` commits create-only Arrow shards and
  ``reader.ShardTailer`` tails them (what campaigns run on: every stage talks through the folder);
- ``memory``: ``memory.MemoryChannel``, groups kept in the process, no encoding, no storage (one-process tools,
  tests and benchmarks of the parts around the channel).

The contract (``tests/test_channel.py`` runs it on every backend): a group is handed out whole, at most once,
in version then commit order and only while inside the window; a group the window moved past becomes a
``dropped_stale`` event with ``Window.stale_reason``; only a flushed group is acknowledged (``ShardInfo``), and
a group acknowledged is never lost; a reader built from another's cursor hands out exactly the groups that
follow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.cursor import TailCursor, TailEvent
from pipelines_lib.trajectory.reader import GroupSlice, ShardTailer
from pipelines_lib.trajectory.record import Trajectory
from pipelines_lib.trajectory.trainable import TrainerNeeds
from pipelines_lib.trajectory.window import Window
from pipelines_lib.trajectory.writer import ShardInfo, ShardWriter, WriterConfig


class GroupSink(Protocol):
    """A rollout worker's end: buffers whole groups and acknowledges them when committed."""

    def add_group(self, group: Sequence[Trajectory]) -> list[ShardInfo]: ...

    def flush_due(self) -> list[ShardInfo]: ...

    def flush(self) -> list[ShardInfo]: ...

    def next_flush_in(self) -> float | None: ...


class GroupSource(Protocol):
    """The trainer's end: whole groups of a window, what it did not hand out, and where it is."""

    cursor: TailCursor

    def next_groups(self, max_groups: int, window: Window) -> list[GroupSlice]: ...

    def drain_events(self) -> list[TailEvent]: ...


class Channel(Protocol):
    def writer(self, worker_id: str, config: WriterConfig | None = None) -> GroupSink: ...

    def reader(self, cursor: TailCursor | None = None, needs: TrainerNeeds | None = None) -> GroupSource: ...


class FolderChannel:
    """The campaign folder at ``store``: shards written by ``ShardWriter``, tailed by ``ShardTailer``."""

    def __init__(self, store: Store, *, clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self._clock = clock

    def writer(self, worker_id: str, config: WriterConfig | None = None) -> ShardWriter:
        clock = {} if self._clock is None else {"clock": self._clock}
        return ShardWriter(self.store, worker_id=worker_id, config=config, **clock)

    def reader(self, cursor: TailCursor | None = None, needs: TrainerNeeds | None = None) -> ShardTailer:
        return ShardTailer(self.store, cursor=cursor, needs=needs)

