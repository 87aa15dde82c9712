"""The shard writer: buffers whole GRPO groups and commits them as create-only shards (``codec`` encodes them).

``GroupBuffer`` is the buffering every channel backend shares; ``ShardWriter`` puts its commits in the campaign
folder (``memory.MemoryWriter`` keeps them in the process). A buffer is committed when it is big enough **or**
old enough (a slow trickle of groups must still reach the trainer within ``max_age_s``). It never loses a group
it acknowledged: ``add_group`` only buffers; a group is acknowledged when the ``flush`` that committed it
returns its ``ShardInfo``. A failed commit keeps the buffer, so the next flush retries it under the same name:
a retried commit that finds its own bytes already there counts as done.

All groups in a shard share the *oldest policy version* of their tokens, which names the shard's folder, so
the trainer's version-window listing finds exactly the groups it may still use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import AlreadyExistsError, StorageError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import ShardInfo, WriterConfig
from pipelines_lib.trajectory.codec import TOKEN_BYTES, decode_shard, encode_shard
from pipelines_lib.trajectory.record import Trajectory, group_min_version, to_table
from pipelines_lib.utc import utc_now_iso


@dataclass
class _Buffer:
    groups: list[list[Trajectory]]
    first_added: float
    n_bytes: int


class GroupBuffer:
    """Buffers whole groups per oldest policy version and commits them by size or age (not thread-safe); a
    subclass says where a commit goes (``_put``). Commits are named and numbered as shards in every backend."""

    def __init__(self, *, worker_id: str, config: WriterConfig | None = None,
                 clock: Callable[[], float] = time.monotonic, first_seq: int = 0) -> None:
        self.worker_id = layout.check_worker_id(worker_id)
        self.config = config or WriterConfig()
        self._clock = clock
        self._seq = first_seq
        self._buffers: dict[int, _Buffer] = {}
        self.committed: list[ShardInfo] = []

    @property
    def buffered_groups(self) -> int:
        return sum(len(b.groups) for b in self._buffers.values())

    def add_group(self, group: Sequence[Trajectory]) -> list[ShardInfo]:
        """Buffer one complete group; commit what is due. Returns the shards committed by this call."""
        group = list(group)
        if not group:
            raise ValueError("add_group: empty group")
        ids = {t.group_id for t in group}
        size = group[0].group_size
        if len(ids) != 1 or sorted(t.sample_idx for t in group) != list(range(size)):
            raise ValueError(
                f"add_group: not one whole group: group_ids {sorted(ids)}, "
                f"sample_idx {sorted(t.sample_idx for t in group)}, group_size {size}"
            )
        version = group_min_version(group)
        n_bytes = sum(len(t.tokens) for t in group) * TOKEN_BYTES + 512 * len(group)
        buf = self._buffers.setdefault(version, _Buffer(groups=[], first_added=self._clock(), n_bytes=0))
        buf.groups.append(group)
        buf.n_bytes += n_bytes
        return self.flush_due()

    def flush_due(self) -> list[ShardInfo]:
        """Commit every buffer that is full or old enough (call it periodically on a trickle)."""
        now = self._clock()
        due = [
            v for v, b in self._buffers.items()
            if len(b.groups) >= self.config.max_groups or b.n_bytes >= self.config.max_bytes
            or now - b.first_added >= self.config.max_age_s
        ]
        return [self._commit(v) for v in sorted(due)]

    def flush(self) -> list[ShardInfo]:
        """Commit everything buffered."""
        return [self._commit(v) for v in sorted(self._buffers)]

    def next_flush_in(self) -> float | None:
        """Seconds until the oldest buffer is due by age (None when nothing is buffered)."""
        if not self._buffers:
            return None
        oldest = min(b.first_added for b in self._buffers.values())
        return max(0.0, oldest + self.config.max_age_s - self._clock())

    def _commit(self, version: int) -> ShardInfo:
        buf = self._buffers[version]
        rows = [t for g in buf.groups for t in g]
        table = to_table(rows)
        sid = layout.ShardId(version=version, worker_id=self.worker_id, seq=self._seq, groups=len(buf.groups))
        n_bytes = self._put(sid, table)
        info = ShardInfo(path=sid.path, version=version, worker_id=self.worker_id, seq=self._seq,
                         n_groups=len(buf.groups), n_rows=len(rows), n_bytes=n_bytes,
                         group_ids=tuple(g[0].group_id for g in buf.groups))
        del self._buffers[version]
        self._seq += 1
        self.committed.append(info)
        return info

    def _put(self, sid: layout.ShardId, table: pa.Table) -> int:
        """Commit ``table`` as shard ``sid`` (a retry of a commit that landed must succeed); its size in bytes."""
        raise NotImplementedError


class ShardWriter(GroupBuffer):
    """Commits buffered groups as create-only Arrow shards in the campaign folder at ``store``."""

    def __init__(self, store: Store, *, worker_id: str, config: WriterConfig | None = None,
                 clock: Callable[[], float] = time.monotonic, first_seq: int = 0) -> None:
        super().__init__(worker_id=worker_id, config=config, clock=clock, first_seq=first_seq)
        self.store = store

    def _put(self, sid: layout.ShardId, table: pa.Table) -> int:
        path = sid.path
        provenance = {
            "worker_id": self.worker_id, "seq": sid.seq, "version": sid.version, "n_groups": sid.groups,
            "created_at": utc_now_iso(),
            "policy_versions": sorted(v for v in pc.unique(pc.list_flatten(table.column("policy_version"))).to_pylist()
                                      if v >= 0),
        }
        data = encode_shard(table, provenance, campaign=layout.campaign_id(self.store.url))
        try:
            self.store.create(path, data)
        except AlreadyExistsError:
            # Our own earlier attempt may have landed before its reply was lost: same bytes == committed.
            existing = self.store.read(path)
            if decode_shard(existing, path, validate=False)[0].column("trajectory_id").to_pylist() != \
                    table.column("trajectory_id").to_pylist():
                raise StorageError("create", self.store.uri(path),
                                   "a different shard already has this name: is another process using "
                                   f"worker_id {self.worker_id!r}?") from None
        return len(data)
