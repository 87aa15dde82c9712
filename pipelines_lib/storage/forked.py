"""A fork's campaign folder as its stages see it: its own objects, over its parent's history up to the fork point.

```
ForkStore(own folder, below=parent view, inherits=layout.inherited(step=N, version=V))
  read, exists, size, uri      own object first; else, for an inherited path, the parent's
  list, walk                   own names ∪ the parent's inherited names
  create, delete, pointers     own folder only; creating a name the parent holds is a create-only conflict
```

A fork references the parent's dataset, shards, consumption logs, checkpoints and published versions instead of
copying them: the tailer hands out the parent's shards (those it had not trained on at the fork step included),
the trainer restores the parent's checkpoint and replays its logs, lineage and the audit walk the parent's logs
and shards, all through this view. The parent view is itself a ``ForkStore`` for a fork of a fork, so a chain of
forks resolves level by level, each level seeing its parent only up to its own fork point. Nothing written
through this store reaches the parent: every write goes to the fork's own folder, and a name the parent already
holds counts as existing (create-only), so a retried writer that finds it is a no-op as usual.

``records.with_parents`` builds the view from ``campaign.json``; this module knows nothing of records.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipelines_lib.storage.errors import AlreadyExistsError, NotFoundError
from pipelines_lib.storage.store import Store

_OWNERS_CAP = 100_000
"""Resolved paths remembered (objects are create-only, so an owner never changes); the memo restarts past it."""


class ForkStore(Store):
    """``own`` (the fork's folder, where everything is written) over ``below`` (the parent, only read) for the
    relative paths, objects and folders, that ``inherits`` accepts."""

    def __init__(self, own: Store, *, below: Store, inherits: Callable[[str], bool]) -> None:
        super().__init__(own.url, retry=own.retry, storage_options=own.storage_options,
                         external_deadline_s=own.external_deadline_s, sleep=own._sleep)
        self.own = own
        self.below = below
        """The parent as its own stages see it (a ``ForkStore`` itself when the parent is a fork)."""
        self.inherits = inherits
        self._owners: dict[str, Store] = {}

    def __repr__(self) -> str:
        return f"ForkStore({self.url!r} over {self.below!r})"

    def _remember(self, rel: str, owner: Store) -> Store:
        if len(self._owners) >= _OWNERS_CAP:
            self._owners.clear()
        self._owners[rel] = owner
        return owner

    def _owner(self, rel: str) -> Store | None:
        """The store holding object or folder ``rel`` (own first), or None when neither holds it."""
        if rel in self._owners:
            return self._owners[rel]
        if self.own.exists(rel):
            return self._remember(rel, self.own)
        if self.inherits(rel) and self.below.exists(rel):
            return self._remember(rel, self.below)
        return None

    # -- reads: own first, then the parent's inherited history --------------------------------------------
    def uri(self, rel: str = "") -> str:
        if not rel or not self.inherits(rel):
            return self.own.uri(rel)
        return (self._owner(rel) or self.own).uri(rel)

    def local_path(self, rel: str = "") -> Path | None:
        owner = self._owner(rel) if rel and self.inherits(rel) else None
        return (owner or self.own).local_path(rel)

    def holder(self, rel: str) -> Store:
        owner = self._owner(rel) if rel and self.inherits(rel) else None
        return self.own if owner is None or owner is self.own else owner.holder(rel)

    def read(self, rel: str, *, max_bytes: int | None = None) -> bytes:
        owner = self._owners.get(rel)
        if owner is not None or not self.inherits(rel):
            return (owner or self.own).read(rel, max_bytes=max_bytes)
        try:
            return self.own.read(rel, max_bytes=max_bytes)
        except NotFoundError as missing:
            try:
                data = self.below.read(rel, max_bytes=max_bytes)
            except NotFoundError:
                raise missing from None
            self._remember(rel, self.below)
            return data

    def exists(self, rel: str) -> bool:
        return rel in self._owners or self.own.exists(rel) or (self.inherits(rel) and self.below.exists(rel))

    def size(self, rel: str) -> int:
        return (self._owner(rel) or self.own).size(rel)

    def list(self, rel: str, *, include_hidden: bool = False) -> list[str]:
        names = set(self.own.list(rel, include_hidden=include_hidden))
        if self.inherits(rel):
            prefix = f"{rel.strip('/')}/" if rel.strip("/") else ""
            names |= {n for n in self.below.list(rel, include_hidden=include_hidden) if self.inherits(prefix + n)}
        return sorted(names)

    def list_if_changed(self, rel: str, since: int | None) -> tuple[list[str] | None, int | None]:
        """Always a fresh listing: a folder merged from two stores has no one modification time to compare."""
        return self.list(rel), None

    def walk(self, rel: str = "", *, skip: Callable[[str], bool] | None = None) -> list[str]:
        paths = set(self.own.walk(rel, skip=skip))
        if self.inherits(rel):
            paths |= {p for p in self.below.walk(rel, skip=skip) if self.inherits(p)}
        return sorted(paths)

    # -- writes: the fork's own folder only -----------------------------------------------------------------
    def create(self, rel: str, data: bytes) -> None:
        """Create-only over both: a name the parent holds exists already (its own bytes again: a no-op)."""
        if self.inherits(rel) and self.below.exists(rel):
            if self.below.read(rel) != data:
                raise AlreadyExistsError("create", self.below.uri(rel),
                                         "the parent campaign holds this object (a fork never writes there)")
            return
        self.own.create(rel, data)

    def delete(self, rel: str) -> None:
        self.own.delete(rel)


__all__ = ["ForkStore"]
