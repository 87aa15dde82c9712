"""The campaign-folder backend of the channel (``channel`` has the contract): what campaigns run on.

A sink is a ``writer.ShardWriter`` committing create-only Arrow shards under ``trajectories/v<version>/``, a source
a ``reader.ShardTailer`` tailing them; a restarted worker finds what its earlier starts committed by the names of
their shards (``<worker>.<nonce>-<seq>-<groups>.arrow``) and the group ids inside.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.codec import read_shard
from pipelines_lib.trajectory.cursor import TailCursor
from pipelines_lib.trajectory.reader import ShardTailer
from pipelines_lib.trajectory.trainable import TrainerNeeds
from pipelines_lib.trajectory.writer import ShardWriter


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

    def committed_groups(self, worker: str) -> set[str]:
        done: set[str] = set()
        for vdir in self.store.list(layout.TRAJECTORIES):
            for name in self.store.list(f"{layout.TRAJECTORIES}/{vdir}"):
                if name.startswith(f"{worker}."):
                    table, _ = read_shard(self.store, f"{layout.TRAJECTORIES}/{vdir}/{name}", validate=False)
                    done.update(table.column("group_id").to_pylist())
        return done
