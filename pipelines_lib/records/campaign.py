"""Records of the campaign as a whole: ``campaign.json`` (``CampaignManifest``, with the ``ForkParent`` of a fork)
and the prep stage's ``dataset/_SUCCESS`` (``DatasetSuccess``); ``fork_chain`` and ``with_parents`` open a fork
over its parents' history, ``read_folders`` names every folder such a view reads."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pipelines_lib.records.base import Record, RecordError, _Record
from pipelines_lib.storage import layout
from pipelines_lib.storage.forked import ForkStore
from pipelines_lib.storage.store import Store, normalize_url

LINEAGE_PROTOCOLS = ("file", "gs", "gcs", "memory")
"""The storage a campaign is kept on (the GCS emulator is ``gs`` with an ``endpoint_url``): the only protocols a
fork's ``parent.url``, read from the campaign's own content, may name."""

# -- campaign.json ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ForkParent(_Record):
    """Where a forked campaign came from: the parent's URL, the step whose state it starts from, and the
    settings it changed. The fork references the parent's history up to there (``with_parents``), never copies it."""

    url: str
    step: int
    version: int
    """The parent's policy version after ``step``: the fork's rollout workers start on it."""
    config_diff: dict[str, Any]
    """Dotted config key → ``{"parent": value, "fork": value}`` for every setting the fork changed."""


@dataclass(frozen=True, kw_only=True)
class CampaignManifest(Record):
    """The campaign's config snapshot, written once when it starts."""

    kind: str = "campaign"
    """``campaign`` (a ``CampaignConfig`` in ``config``) or ``demo`` (the synthetic demo's parameters)."""
    schema_version: str
    code_version: str
    created_at: str
    config: dict[str, Any]
    parent: ForkParent | None = None
    """Set for a fork (``stages.fork``); absent in campaigns started from scratch and in older manifests."""

    PATH: ClassVar[str] = layout.CAMPAIGN_JSON

    @property
    def eval_versions(self) -> Literal["all", "ends"]:
        """Which published versions the campaign evaluates: its config's ``eval.versions`` (``EvalConfig``), read
        without building the config (that imports the model code); ``all`` in configs from before the setting."""
        return self.config.get("eval", {}).get("versions", "all")


class ForkLineageError(RecordError):
    """A fork's ``parent`` that cannot be followed: a URL on storage no campaign is kept on (``LINEAGE_PROTOCOLS``; anything
    else, ``http://`` say, would have every reader of the campaign fetch what its content names)."""


class ForkLoopError(ForkLineageError):
    """A fork's ancestry comes back to a campaign already in it."""


def _parent_store(store: Store, parent: ForkParent) -> Store:
    where = store.uri(CampaignManifest.PATH)
    try:
        protocol = normalize_url(parent.url).split("://", 1)[0]
        if protocol not in LINEAGE_PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} is not campaign storage ({', '.join(LINEAGE_PROTOCOLS)})")
        return store.other(parent.url)
    except (ValueError, ImportError) as e:
        raise ForkLineageError(f"{where}: parent.url {parent.url!r}: {e}") from None


def fork_chain(store: Store) -> list[tuple[Store, ForkParent]]:
    """A fork's ancestry: ``(campaign, its parent entry)`` from ``store`` up to the first campaign that is no
    fork, nearest first (empty for a campaign that is no fork, or a folder without ``campaign.json``).
    A chain that comes back to a campaign already in it is a ``ForkLoopError`` naming the loop, a parent URL
    that is no campaign storage a ``ForkLineageError``."""
    chain: list[tuple[Store, ForkParent]] = []
    seen = [store.uri()]
    while store.exists(CampaignManifest.PATH) and (parent := CampaignManifest.read(store).parent) is not None:
        chain.append((store, parent))
        store = _parent_store(store, parent)
        if store.uri() in seen:
            raise ForkLoopError(f"{seen[0]}: its fork ancestry loops: {' -> '.join([*seen, store.uri()])}")
        seen.append(store.uri())
    return chain


def read_folders(store: Store) -> list[str]:
    """The campaign folders a reader of ``store`` reads: its own and, for a fork, each parent's (nearest first)."""
    return [store.url] + [parent.url for _, parent in fork_chain(store)]


def with_parents(store: Store) -> Store:
    """The campaign at ``store`` as its stages see it: ``store`` itself, or for a fork a ``ForkStore`` that also
    reads its parent's history up to the fork point (``layout.inherited``), the parent's view being built the
    same way. Only the fork's own folder is ever written through it. Idempotent."""
    if isinstance(store, ForkStore):
        return store
    chain = fork_chain(store)
    if not chain:
        return store
    view = chain[-1][0].other(chain[-1][1].url)
    for fork, parent in reversed(chain):
        view = ForkStore(fork, below=view, inherits=functools.partial(layout.inherited, step=parent.step,
                                                                      version=parent.version))
    return view


# -- dataset/_SUCCESS ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SplitInfo(_Record):
    path: str
    rows: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class DatasetSuccess(Record):
    """The prep stage's marker: which splits it wrote, their sizes and hashes, and rows it refused."""

    source: str
    seed: int
    splits: dict[str, SplitInfo]
    bad_rows: list[str]

    PATH: ClassVar[str] = layout.DATASET_SUCCESS
