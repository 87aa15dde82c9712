"""What the audit's processes share: a work unit (``Unit``: one version folder's shards), the counts its result
carries (``Tally``) and the bounded fetch of its objects (``prefetch``). No Arrow here: the merging process
(``campaign``) imports this, the decoding (``worker``) is imported only by the processes that decode.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines_lib.audit.report import BadFile, Counts, Finding
from pipelines_lib.audit.stats import Distribution
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.retry import storage_down
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.needs import TrainerNeeds

Missing = StorageError
"""Why a listed object was not read: it is gone, not a regular object, too large, or refused (a permission)."""


def _read(store: Store, path: str, max_bytes: int | None) -> bytes | Missing:
    # A listed object that fails on its own (gone, not a regular object, over ``max_bytes``, refused) is a finding
    # about it, named, and the rest is read on; a storage that keeps failing (transient errors past the store's
    # retries) stops the reader.
    try:
        return store.read(path, max_bytes=max_bytes)
    except StorageError as e:
        if storage_down(e):
            raise
        return e


def prefetch(store: Store, paths: Iterable[str], read_ahead: int, *,
             max_bytes: int | None = None) -> Iterator[tuple[str, bytes | Missing]]:
    """Objects in ``paths`` order, at most ``read_ahead`` requests in flight of at most ``max_bytes`` each (bounded
    memory; a larger object is a ``TooLargeError`` in its place). A local folder is read inline: there is no
    request latency to hide, and handing each file over from a thread costs more."""
    if store.local_path() is not None:
        yield from ((path, _read(store, path, max_bytes)) for path in paths)
        return
    todo = iter(paths)
    with ThreadPoolExecutor(max_workers=read_ahead, thread_name_prefix="audit-read") as pool:
        window: deque[tuple[str, Future]] = deque((p, pool.submit(_read, store, p, max_bytes))
                                                  for p in itertools.islice(todo, read_ahead))
        while window:
            path, fut = window.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                window.append((nxt, pool.submit(_read, store, nxt, max_bytes)))
            yield path, fut.result()


@dataclass
class Tally:
    shards: int = 0
    trajectories: int = 0
    groups: int = 0
    bytes: int = 0
    reward_sum: float = 0.0

    def add(self, other: Tally) -> None:
        self.shards, self.trajectories, self.groups = (self.shards + other.shards, self.trajectories + other.trajectories,
                                                       self.groups + other.groups)
        self.bytes, self.reward_sum = self.bytes + other.bytes, self.reward_sum + other.reward_sum

    def counts(self) -> Counts:
        return Counts(shards=self.shards, trajectories=self.trajectories, groups=self.groups, bytes=self.bytes,
                      reward_mean=self.reward_sum / self.trajectories if self.trajectories else None)


@dataclass(kw_only=True)
class Gathered:
    """The findings and counts an audit gathers: per version folder in a worker (``worker.UnitAudit``), then
    folded together in version order by the merging process (``campaign._Merged``)."""

    findings: list[Finding] = field(default_factory=list)
    bad_files: list[BadFile] = field(default_factory=list)
    schema_versions: Counter[str] = field(default_factory=Counter)
    by_version: dict[int, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_worker: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    dists: dict[str, Distribution] = field(default_factory=lambda: defaultdict(Distribution))
    statuses: Counter[str] = field(default_factory=Counter)
    tool_calls: Counter[str] = field(default_factory=Counter)
    tool_errors: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One version folder's shards (paths in shard order), audited on their own (on a worker when ``jobs`` > 1)."""

    version: int
    url: str
    storage_options: dict[str, Any]
    shards: tuple[str, ...]
    needs: TrainerNeeds | None
    newest_version: int | None
    read_ahead: int
    over_parents: bool = True
    """Read over its parents' history (``records.with_parents``), as the merging process reads it: False when the
    campaign's fork ancestry could not be followed (a finding of its own)."""

    @property
    def folder(self) -> str:
        return layout.version_dir(self.version)

    @property
    def digest(self) -> str:
        """What the unit's result depends on besides the newest published version: its shards (create-only, so
        their names) and the trainer's needs."""
        import hashlib  # OpenSSL's library, megabytes a process: only an audit that keeps or reuses results needs it

        needs = None if self.needs is None else dataclasses.asdict(self.needs)
        text = json.dumps([list(self.shards), needs], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_plain(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "needs": None if self.needs is None else dataclasses.asdict(self.needs)}

    @classmethod
    def from_plain(cls, raw: dict[str, Any]) -> Unit:
        return cls(**{**raw, "shards": tuple(raw["shards"]),
                      "needs": None if raw["needs"] is None else TrainerNeeds(**raw["needs"])})


