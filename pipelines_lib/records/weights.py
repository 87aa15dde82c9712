"""Records of published weights: ``Publication``, both the ``PUBLISHED.json`` marker inside ``weights/v<N>/``
and each entry of the ``weights/LATEST`` pointer; ``published_versions`` lists what the pointer has named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from pipelines_lib.records.base import Record
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

# -- weights/v<N>/PUBLISHED.json and weights/LATEST ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Publication(Record):
    """A published version: the marker inside its folder, and the same payload as a ``weights/LATEST`` entry."""

    version: int
    path: str
    step: int
    """The trainer step whose parameters these are (0 for the warm start)."""
    published_at: str

    KEY: ClassVar[tuple[str, ...]] = ("version",)

    @classmethod
    def path_of(cls, version: int) -> str:  # type: ignore[override]
        """The commit marker of ``weights/v<N>``, written before ``advance`` moves the pointer."""
        return layout.published_marker(version)

    def advance(self, store: Store) -> bool:
        """Move ``weights/LATEST`` forward to this publication (False if it is already at or past it)."""
        return store.advance_pointer(layout.WEIGHTS_LATEST, self.to_json())

    @classmethod
    def latest(cls, store: Store) -> Self | None:
        """What ``weights/LATEST`` points at, or None before the first publication."""
        raw = store.read_pointer(layout.WEIGHTS_LATEST)
        return None if raw is None else cls.from_json(raw, where=store.uri(layout.WEIGHTS_LATEST))

    @classmethod
    def mirror(cls, store: Store) -> Self:
        """The plain ``weights/LATEST.json`` file (the tool-readable copy of the pointer's newest entry)."""
        return cls.at(store, layout.WEIGHTS_LATEST)

    @classmethod
    def entry(cls, store: Store, version: int) -> Self:
        """The pointer entry that moved ``weights/LATEST`` to ``version``."""
        return cls.at(store, store.pointer_entry(layout.WEIGHTS_LATEST, version))


def published_versions(store: Store) -> list[int]:
    """Versions the ``weights/LATEST`` pointer has named, ascending."""
    return store.pointer_keys(layout.WEIGHTS_LATEST)
