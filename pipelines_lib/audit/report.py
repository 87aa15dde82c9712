"""The audit report: plain frozen dataclasses, ``to_json()`` for tools and ``render_text()`` for people.

``campaign.audit_campaign`` fills it; nothing here does IO. ``ok`` is the one verdict a CLI or a flow needs:
False when any shard breaks an invariant, a file under ``trajectories/`` is foreign or unreadable, or the
lineage double-counts or invents a group. Orphaned temporaries (a writer died mid-commit) are only a warning:
readers never see them and they change no data.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipelines_lib.audit.stats import Summary

FILE_PROBLEMS = ("foreign_name", "unreadable", "foreign_schema", "schema_version", "not_a_file", "oversized")
"""Kinds of ``BadFile``: not a shard name; bytes that are not Arrow IPC (or storage refused them), or a version
folder that does not list; Arrow without rollstream schema metadata; a rollstream schema this code cannot read
(other major, wrong types); a FIFO, device, empty folder or symlink leading outside the campaign (never opened);
declared sizes over the readers' limits (never decoded)."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One invariant violation: in a shard (``row`` set for row-level ones) or in a consumption log."""

    kind: str
    path: str
    row: int | None
    trajectory_id: str | None
    message: str

    def __str__(self) -> str:
        where = self.path + (f" row {self.row}" if self.row is not None else "")
        tid = f" ({self.trajectory_id})" if self.trajectory_id else ""
        return f"{where}{tid}: {self.kind}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class BadFile:
    path: str
    kind: str
    """One of ``FILE_PROBLEMS``."""
    reason: str

    def __post_init__(self) -> None:
        if self.kind not in FILE_PROBLEMS:
            raise ValueError(f"BadFile.kind must be one of {FILE_PROBLEMS}, got {self.kind!r}")


@dataclass(frozen=True, kw_only=True)
class Counts:
    shards: int
    trajectories: int
    groups: int
    bytes: int
    reward_mean: float | None


@dataclass(frozen=True, kw_only=True)
class GroupAccounting:
    """Where each group of the committed shards went, according to the consumption logs."""

    consumed: int
    dropped_stale: int
    pending: int
    """Committed in a valid shard, neither consumed nor dropped yet."""
    unusable: int
    """In a shard that breaks an invariant or that the trainer cannot train on: the trainer's tailer skips those."""
    skipped: int = 0
    """Logged by the trainer as skipped (with a reason) though the audit finds nothing wrong with them."""


@dataclass(frozen=True, kw_only=True)
class SkippedShard:
    step: int
    shard: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class PublishedVersion:
    """A ``weights/LATEST`` entry and the training that produced it since the previous publication."""

    version: int
    step: int | None
    path: str
    published_at: str
    steps: tuple[int, ...]
    shards: tuple[str, ...]
    groups: int
    prompts: int
    """Distinct prompt ids among the groups consumed by ``steps``."""


@dataclass(frozen=True, kw_only=True)
class Lineage:
    consumption_logs: int
    last_step: int | None
    accounting: GroupAccounting
    by_version: dict[int, GroupAccounting]
    staleness: dict[int, int]
    """trainer version - group version -> consumed groups."""
    trainer_skipped: tuple[SkippedShard, ...]
    published: tuple[PublishedVersion, ...]


@dataclass(frozen=True, kw_only=True)
class Ancestor:
    """A campaign this one was forked from (directly or through other forks), read up to the fork point."""

    url: str
    step: int
    """The step its fork started from: only its consumption logs up to this step are followed."""
    version: int
    published: tuple[PublishedVersion, ...]
    """Its versions up to ``version``, each with the steps, shards and groups behind it."""


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    url: str
    audited_at: str
    seconds: float
    files: int
    """Objects in the campaign folder (temporaries included)."""
    shards: int
    """Shard-named files under ``trajectories/`` that read with a supported schema."""
    trajectories: int
    groups: int
    by_version: dict[int, Counts]
    by_worker: dict[str, Counts]
    schema_versions: dict[str, int]
    """Schema version -> shards carrying it (unsupported versions included; ``none`` for foreign Arrow)."""
    violation_counts: dict[str, int]
    violations: tuple[Finding, ...]
    """The first ``max_listed`` findings; ``violation_counts`` counts all of them."""
    bad_files: tuple[BadFile, ...]
    orphaned_temporaries: tuple[str, ...]
    reward: Summary
    tokens: Summary
    generated_tokens: Summary
    turns: Summary
    statuses: dict[str, int]
    tool_calls: dict[str, int]
    tool_errors: dict[str, dict[str, int]]
    """tool name -> error kind -> count."""
    lineage: Lineage | None
    """None until the trainer has written a consumption log or a version was published."""
    campaign: dict[str, Any] | None
    """``campaign.json`` as written (the config snapshot), when present."""
    evals: tuple[str, ...]
    ancestry: tuple[Ancestor, ...] = ()
    """For a fork: its parent, the parent's parent, …, each followed read-only up to the fork point."""

    @property
    def ok(self) -> bool:
        return not self.violation_counts and not self.bad_files

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.orphaned_temporaries:
            out.append(f"{len(self.orphaned_temporaries)} orphaned temporary object(s) (a writer died mid-commit; "
                       "safe to delete once no writer runs)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready values (what the audit stage keeps in ``records.AuditRecord``)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, "warnings": self.warnings, **self.to_dict()}, indent=2, default=str)

    def render_text(self, *, max_rows: int = 20) -> str:
        out = [f"audit of {self.url}  ({self.audited_at}, {self.seconds:.1f} s)",
               f"verdict: {'OK' if self.ok else 'FAILED'}; {self.files} files, {self.shards} shards, "
               f"{self.trajectories} trajectories, {self.groups} groups",
               f"schema versions: {_kv(self.schema_versions) or '-'}"]
        if self.campaign is not None:
            out.append(f"campaign manifest: {len(self.campaign)} keys ({', '.join(sorted(self.campaign)[:8])})")
            if (parent := self.campaign.get("parent")) is not None:
                out.append(f"forked from {parent['url']} at step {parent['step']} (version {parent['version']}); "
                           f"changed: {_kv({k: v['fork'] for k, v in parent['config_diff'].items()}) or '-'}")
        out += ["", "per version:", _counts_table("version", self.by_version),
                "", "per worker:", _counts_table("worker", self.by_worker)]
        out += ["", "distributions:", _table(
            ["quantity", "count", "mean", "p50", "p95", "max"],
            [[name, s.count, _num(s.mean), _num(s.p50), _num(s.p95), _num(s.max)] for name, s in
             (("reward", self.reward), ("tokens", self.tokens), ("generated tokens", self.generated_tokens),
              ("turns", self.turns))])]
        out.append(f"statuses: {_kv(self.statuses) or '-'}")
        out.append(f"tool calls: {_kv(self.tool_calls) or '-'}")
        errors = {f"{tool}/{kind}": n for tool, kinds in self.tool_errors.items() for kind, n in kinds.items()}
        out.append(f"tool errors: {_kv(errors) or '-'}")
        out += ["", self._render_lineage()]
        for a in self.ancestry:
            out += [f"forked from {a.url} at step {a.step} (version {a.version}); its lineage up to there:",
                    _published_table(a.published)]
        if self.evals:
            out += ["", f"evaluations: {', '.join(self.evals)}"]
        out += ["", f"violations: {_kv(self.violation_counts) or 'none'}"]
        out += [f"  {f}" for f in self.violations[:max_rows]]
        if sum(self.violation_counts.values()) > max_rows:
            out.append(f"  ... {sum(self.violation_counts.values()) - max_rows} more (see --json)")
        out.append(f"bad files: {len(self.bad_files) or 'none'}")
        out += [f"  {b.path}: {b.kind}: {b.reason}" for b in self.bad_files[:max_rows]]
        for w in self.warnings:
            out.append(f"warning: {w}")
            out += [f"  {p}" for p in self.orphaned_temporaries[:max_rows]]
        return "\n".join(out)

    def _render_lineage(self) -> str:
        lin = self.lineage
        if lin is None:
            return "lineage: no consumption logs or published versions yet"
        a = lin.accounting
        out = [f"lineage: {lin.consumption_logs} consumption logs (last step {lin.last_step}); groups: "
               f"{a.consumed} consumed, {a.dropped_stale} dropped stale, {a.pending} pending, {a.unusable} unusable, "
               f"{a.skipped} skipped",
               _table(["version", "consumed", "dropped", "pending", "unusable", "skipped"],
                      [[v, c.consumed, c.dropped_stale, c.pending, c.unusable, c.skipped]
                       for v, c in sorted(lin.by_version.items())]),
               f"staleness (trainer version - group version -> groups): {_kv(lin.staleness) or '-'}"]
        if lin.trainer_skipped:
            out.append(f"shards the trainer skipped: {len(lin.trainer_skipped)}")
            out += [f"  step {s.step}: {s.shard}: {s.reason}" for s in lin.trainer_skipped[:10]]
        if lin.published:
            out += ["published versions:", _published_table(lin.published)]
        return "\n".join(out)


def _published_table(published: Sequence[PublishedVersion]) -> str:
    return _table(["version", "step", "steps", "shards", "groups", "prompts", "published_at"],
                  [[p.version, _opt(p.step), _span(p.steps), len(p.shards), p.groups, p.prompts, p.published_at]
                   for p in published])


def _opt(x: object) -> str:
    return "-" if x is None else str(x)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _span(steps: Sequence[int]) -> str:
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]} ({len(steps)})"


def _kv(d: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(d.items(), key=lambda kv: str(kv[0])))


def _counts_table(key: str, counts: dict) -> str:
    return _table([key, "shards", "trajectories", "groups", "MB", "reward mean"],
                  [[k, c.shards, c.trajectories, c.groups, f"{c.bytes / 1e6:.2f}", _num(c.reward_mean)]
                   for k, c in sorted(counts.items())])


def _table(headers: list[str], rows: list[list[object]]) -> str:
    """Left-aligned first column, right-aligned numbers; an empty table says so."""
    if not rows:
        return "  (none)"
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                                      enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)
