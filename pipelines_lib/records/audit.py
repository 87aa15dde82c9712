"""Records of the audit: a kept audit (``AuditRecord``, ``audit/<utc>.json`` and its ``.txt`` rendering) and
each version folder's kept result (``AuditVersionResult``, ``audit/versions/``) that an incremental audit
reuses; ``audit_version_results`` lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines_lib.records.base import Record
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

# -- audit/<utc>.json -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AuditRecord(Record):
    """A kept audit: the verdict, and the whole ``audit.AuditReport`` as plain JSON in ``report``.

    Audits are snapshots of a folder that may still grow, so each is named by its time, not a once-only marker;
    a rendering for people is kept next to it (``.txt``)."""

    audited_at: str
    """ISO time of the audit; the object's name is its compact form."""
    ok: bool
    warnings: list[str]
    report: dict[str, Any]

    KEY: ClassVar[tuple[str, ...]] = ("audited_at",)

    @classmethod
    def path_of(cls, audited_at: str, suffix: str = "json") -> str:  # type: ignore[override]
        return layout.audit_report(layout.utc_compact_of(audited_at), suffix)

    def write(self, store: Store, text: str) -> tuple[str, str]:  # type: ignore[override]
        """The report, then its text rendering; returns both paths."""
        text_path = self.path_of(self.audited_at, "txt")
        json_path = super().write(store)
        store.create(text_path, text.encode())
        return json_path, text_path


def newest_audit(store: Store) -> tuple[str, AuditRecord] | None:
    """(path, record) of the newest kept audit of the folder, or None when it was never audited."""
    names = sorted(n for n in store.list(layout.AUDIT) if layout.is_audit_report(n))
    return (path := f"{layout.AUDIT}/{names[-1]}", AuditRecord.at(store, path)) if names else None


@dataclass(frozen=True, kw_only=True)
class AuditVersionResult(Record):
    """What the audit found in one version folder (its work unit, as plain JSON in ``result``), kept so that a
    later incremental audit (``--since``) reuses it while the folder's shards have not changed."""

    version: int
    digest: str
    """Hash of the folder's shard names and the trainer's needs the checks used."""
    newest_version: int | None
    """The newest published version when it was audited (policy versions above it are findings)."""
    result: dict[str, Any]

    KEY: ClassVar[tuple[str, ...]] = ("version", "digest", "newest_version")

    @classmethod
    def path_of(cls, version: int, digest: str, newest_version: int | None) -> str:  # type: ignore[override]
        return layout.audit_version_result(version, digest, newest_version)


def audit_version_results(store: Store) -> dict[tuple[int, str], list[tuple[int | None, str]]]:
    """(version, digest) -> (newest version, path) of every kept per-version audit result."""
    out: dict[tuple[int, str], list[tuple[int | None, str]]] = {}
    for name in store.list(layout.AUDIT_VERSIONS):
        parsed = layout.parse_audit_version_result(name)
        if parsed is not None:
            out.setdefault(parsed[:2], []).append((parsed[2], f"{layout.AUDIT_VERSIONS}/{name}"))
    return out
