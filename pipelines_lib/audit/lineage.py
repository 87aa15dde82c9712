"""Lineage: reconcile the trainer's consumption logs with the committed shards and the published versions.

Pure functions over already-read records; ``campaign.audit_campaign`` does the reading. The trainer writes one
``records.ConsumptionLog`` per step: the groups it trained on (shard, rows, version, staleness), the groups the
window dropped as stale (a shard dropped unopened names no group: all of its committed groups are dropped) and the
shards (or groups of them) the tailer skipped.

A group is identified by ``(shard, group_id)``. Every committed group ends up in exactly one bucket: consumed
(by one step), dropped as stale, not yet consumed, unusable (its shard breaks an invariant or the trainer
cannot train on it, so the tailer skips it), or skipped (the trainer logged it as skipped for a reason the
audit did not see, e.g. a duplicate of a group already consumed). Accounting a group twice, or accounting a group no shard holds, is a violation.

Every consumed group's staleness is checked against the η in force at its step (``trajectory.window``; a fork
may change η, so a step up to a fork point is held to its parent's): a group trained beyond η is a
``consumed_beyond_eta`` violation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines_lib.audit.report import Finding, GroupAccounting, Lineage, PublishedVersion, SkippedShard
from pipelines_lib.records import ConsumedGroup, ConsumptionLog, ForkParent, Publication
from pipelines_lib.storage import layout
from pipelines_lib.trajectory.window import beyond_eta, staleness

GroupKey = tuple[str, str]
"""(shard path, group_id)."""
EtaBounds = Sequence[tuple[int, int]]
"""``(after step, η)``, newest first: the η the steps after that one (up to the previous entry's) trained under."""


def eta_bounds(campaign: Mapping[str, Any] | None, parents: Sequence[ForkParent],
               findings: list[Finding]) -> EtaBounds:
    """The η each step was trained under, from the campaign record (``CampaignManifest.to_dict()``) and its fork
    parents (nearest first): a fork's steps after its fork point use its own η, the steps up to it the parent's
    (the fork's ``config_diff`` names it when it changed). Empty (nothing checked) for a folder that is not a
    training campaign (the synthetic demo) or records no config; a config without a readable η is a finding."""
    config = (campaign or {}).get("config")
    if not config or campaign.get("kind") != "campaign":
        return []
    try:
        eta = int(config["rollout"]["eta"])
        bounds = []
        for parent in parents:
            bounds.append((parent.step, eta))
            eta = int(parent.config_diff.get("rollout.eta", {}).get("parent", eta))
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        findings.append(Finding(kind="bad_campaign_json", path=layout.CAMPAIGN_JSON, row=None, trajectory_id=None,
                                message=f"rollout.eta does not load, staleness checks skipped: {e!r}"))
        return []
    return [*bounds, (-1, eta)]


def _eta_at(bounds: EtaBounds, step: int) -> int | None:
    return next((eta for after, eta in bounds if step > after), None)


@dataclass(frozen=True, kw_only=True, slots=True)  # one per committed group of the campaign, held to the end
class CommittedGroup:
    version: int
    prompt_id: str
    row_start: int
    row_end: int
    usable: bool
    """False when the group's shard breaks an invariant."""


@dataclass(frozen=True, kw_only=True)
class _Use:
    kind: str  # "consumed", "dropped" or "skipped"
    step: int
    log: str


def reconcile(committed: Mapping[GroupKey, CommittedGroup], logs: Sequence[tuple[str, ConsumptionLog]],
              published: Sequence[Publication], etas: EtaBounds = ()) -> tuple[Lineage | None, list[Finding]]:
    """Lineage from the committed groups, the consumption logs ``(path, log)`` in step order, the
    publications the ``weights/LATEST`` pointer named and the η of each step (``eta_bounds``; none: unchecked).
    Returns ``None`` for the lineage when there are neither logs nor publications."""
    if not logs and not published:
        return None, []
    findings: list[Finding] = []
    uses: dict[GroupKey, list[_Use]] = defaultdict(list)
    stale: Counter[int] = Counter()
    skipped: list[SkippedShard] = []
    consumed_at: dict[int, list[GroupKey]] = defaultdict(list)
    steps: list[int] = []
    shard_groups: dict[str, list[str]] = defaultdict(list)
    for shard, gid in committed:
        shard_groups[shard].append(gid)
    for path, log in logs:
        step = log.step
        steps.append(step)
        eta = _eta_at(etas, step)
        for g in log.groups:
            key = (g.shard, g.group_id)
            uses[key].append(_Use(kind="consumed", step=step, log=path))
            consumed_at[step].append(key)
            stale[staleness(log.trainer_version, g.version)] += 1
            findings += _consumed_problems(path, log.trainer_version, g, committed.get(key), eta)
        for d in log.dropped_stale:
            # A shard dropped unopened names no groups: all of the committed ones are its dropped groups.
            for gid in d.groups or (shard_groups[d.shard] if d.unread_groups else ()):
                uses[(d.shard, gid)].append(_Use(kind="dropped", step=step, log=path))
        skipped += [SkippedShard(step=step, shard=s.shard, reason=s.reason) for s in log.skipped]
        for s in log.skipped:
            for gid in s.groups:
                uses[(s.shard, gid)].append(_Use(kind="skipped", step=step, log=path))

    for (shard, gid), used in sorted(uses.items()):
        consumed = [u for u in used if u.kind == "consumed"]
        where = ", ".join(f"{u.kind} at step {u.step}" for u in used)
        if len(consumed) > 1:
            findings.append(Finding(kind="consumed_twice", path=consumed[1].log, row=None, trajectory_id=None,
                                    message=f"group {gid} of {shard}: {where}"))
        elif len(used) > 1:
            findings.append(Finding(kind="accounted_twice", path=used[1].log, row=None, trajectory_id=None,
                                    message=f"group {gid} of {shard}: {where}"))
        if (shard, gid) not in committed and any(u.kind != "skipped" for u in used):
            kind = "consumed_missing" if consumed else "dropped_missing"
            findings.append(Finding(kind=kind, path=used[0].log, row=None, trajectory_id=None,
                                    message=f"group {gid} is in no committed shard (logged from {shard})"))

    # The same group id trained from two shards (a copy the trainer did not recognise) is trained twice too.
    trained_from: dict[str, list[str]] = defaultdict(list)
    for (shard, gid), used in sorted(uses.items()):
        if any(u.kind == "consumed" for u in used):
            trained_from[gid].append(shard)
    findings += [Finding(kind="consumed_twice", path=shards[1], row=None, trajectory_id=None,
                         message=f"group {gid} trained from {len(shards)} shards: {', '.join(shards)}")
                 for gid, shards in sorted(trained_from.items()) if len(shards) > 1]

    by_version: dict[int, Counter[str]] = defaultdict(Counter)
    for key, c in committed.items():
        used = uses.get(key, [])
        bucket = ("unusable" if not c.usable else "pending" if not used
                  else "consumed" if any(u.kind == "consumed" for u in used)
                  else "dropped_stale" if any(u.kind == "dropped" for u in used) else "skipped")
        by_version[c.version][bucket] += 1

    return Lineage(
        consumption_logs=len(steps),
        last_step=max(steps) if steps else None,
        accounting=_accounting(sum(by_version.values(), Counter())),
        by_version={v: _accounting(c) for v, c in sorted(by_version.items())},
        staleness=dict(sorted(stale.items())),
        trainer_skipped=tuple(skipped),
        published=_published(published, sorted(steps), consumed_at, committed),
    ), findings


def _consumed_problems(path: str, trainer_version: int, g: ConsumedGroup, c: CommittedGroup | None,
                       eta: int | None) -> list[Finding]:
    """What is wrong with consumed group ``g`` of the log at ``path``: trained beyond η, or logged with other rows
    than its shard (``c``, when committed) holds it in."""
    out = []
    if eta is not None and beyond_eta(trainer_version, g.version, eta):
        out.append(Finding(kind="consumed_beyond_eta", path=path, row=None, trajectory_id=None,
                           message=f"group {g.group_id} of {g.shard} (version {g.version}) trained at version "
                                   f"{trainer_version}: staleness {staleness(trainer_version, g.version)} > eta {eta}"))
    if c is not None and (c.row_start, c.row_end) != (g.row_start, g.row_end):
        out.append(Finding(kind="consumed_rows_mismatch", path=path, row=None, trajectory_id=None,
                           message=f"group {g.group_id} of {g.shard} logged as rows [{g.row_start}, {g.row_end}), "
                                   f"the shard holds it in rows [{c.row_start}, {c.row_end})"))
    return out


def _accounting(c: Counter[str]) -> GroupAccounting:
    return GroupAccounting(consumed=c["consumed"], dropped_stale=c["dropped_stale"], pending=c["pending"],
                           unusable=c["unusable"], skipped=c["skipped"])


def _published(entries: Sequence[Publication], steps: list[int], consumed_at: Mapping[int, list[GroupKey]],
               committed: Mapping[GroupKey, CommittedGroup]) -> tuple[PublishedVersion, ...]:
    """Each version is credited with the steps after the previous publication, up to its own step."""
    out = []
    prev_step = -1
    for e in sorted(entries, key=lambda e: e.version):
        behind = tuple(s for s in steps if prev_step < s <= e.step)
        keys = [k for s in behind for k in consumed_at[s]]
        out.append(PublishedVersion(
            version=e.version, step=e.step, path=e.path, published_at=e.published_at,
            steps=behind, shards=tuple(sorted({shard for shard, _ in keys})), groups=len(keys),
            prompts=len({committed[k].prompt_id for k in keys if k in committed}),
        ))
        prev_step = max(prev_step, e.step)
    return tuple(out)
