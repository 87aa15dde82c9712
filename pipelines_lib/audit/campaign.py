"""``audit_campaign``: read a whole campaign folder with no other state and report what is in it.

A folder without ``campaign.json`` is not a campaign (``NotACampaignError``): auditing ``/etc`` must not
say "OK". The folder is listed once, a version folder at a time:

- ``trajectories/``: every object must be a shard name that decodes with a supported schema
  (``BadFile`` otherwise; FIFOs, devices and symlinks out of the campaign are ``not_a_file`` and never
  opened); each readable shard is validated row by row (``Finding`` per violation, with shard and row),
  counted per version and worker, and folded into the distributions (``stats``). A trajectory id seen in
  two shards is a ``duplicate_trajectory``.
- what the trainer needs (``trajectory.trainable``), when ``campaign.json`` holds a config: declared sizes
  within its row budget (checked before decoding), group size, row length against the largest bucket within
  the model's ``max_seq_len``, token ids in the vocabulary, rewards within ``MAX_ABS_REWARD``, policy versions not newer than the newest published and matching the version
  folder, contiguous groups, content written under this shard's name (``untrainable_group``,
  ``interleaved_groups``, ``copied_shard``). The trainer's tailer skips exactly these.
- a version folder that does not list (``unreadable``) or holds an empty folder (``not_a_file``): never skipped.
- anything whose name carries ``TEMP_MARKER``, anywhere: an orphaned temporary (a warning).
- what a restart restores from (``state``): the ``weights/LATEST`` entries, checkpoints, consumption logs' tail
  cursors, evaluations and the config snapshot (``config_check``); each that would stop a restart is a finding.
  Consumption logs and pointer entries are then handed to ``lineage.reconcile``.
- for a fork (``campaign.json`` names a ``parent``): the folder is read over its parent's history up to the fork
  point (``records.with_parents``: the parent's shards up to the fork's version, its consumption logs up to the
  step, its publications), read-only, so lineage walks back from the fork's versions through the parent's
  shards; the ``ancestry`` lists the parents, nearest first, each with its versions up to its fork point.

Each version folder is one work unit (``Unit``), listed only when its turn comes, so the listing held at any
time is one folder's, not the campaign's. Its shards are fetched ``read_ahead`` at a time on a thread pool (a
GCS audit is bound by request latency) and decoded in name order (``worker.audit_unit``): in this process when
``jobs`` is 1, else on ``jobs`` worker processes (``pool``: ``python -m pipelines_lib.audit.worker``, long-lived,
a unit at a time each, answering in JSON: decoding is CPU-bound, threads do not help under the GIL). This process then only
lists, merges and reconciles: it imports neither Arrow nor the decoding code, so the workers are the only
processes paying for them. A unit's result is small and bounded: counts, value -> count distributions
(``stats.Distribution``), findings, the committed groups lineage needs and a 64-bit hash per trajectory id.
Merged, they stay compact while the workers run (the hashes as bytes, the committed groups compressed): the
duplicates across folders are found by one sort, and lineage's mapping is built, once the workers are gone.
Results merge in version order, so the report does not depend on timing or on ``jobs``. Every wait on a worker
has a deadline (``unit_timeout_s``); a worker that dies or overruns stops the audit with a
``pool.AuditWorkerError`` naming the folder. ``progress`` gets a line every
``progress_every`` shards.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipelines_lib import records
from pipelines_lib.audit.lineage import CommittedGroup, EtaBounds, GroupKey, eta_bounds, reconcile
from pipelines_lib.audit.pool import results
from pipelines_lib.audit.report import Ancestor, AuditReport, BadFile, Finding, Lineage
from pipelines_lib.audit.state import (
    ConfigCheck,
    checkpoint_findings,
    config_findings,
    cursor_findings,
    eval_findings,
    pointer_entries,
    read_records,
)
from pipelines_lib.audit.unit import Gathered, Tally, Unit
from pipelines_lib.records import (
    AuditVersionResult,
    CampaignManifest,
    ConsumptionLog,
    ForkLineageError,
    ForkLoopError,
    ForkParent,
    Publication,
    RecordError,
)
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import AlreadyExistsError, NotFoundError, StorageError
from pipelines_lib.storage.retry import storage_down
from pipelines_lib.storage.store import TEMP_MARKER, Store
from pipelines_lib.trajectory.needs import MAX_DECODED_BYTES, MAX_SHARD_ROWS, TrainerNeeds
from pipelines_lib.utc import utc_now_iso

_TRAJECTORIES = f"{layout.TRAJECTORIES}/"


class NotACampaignError(NotFoundError):
    """The folder has no ``campaign.json``."""


def _duplicate_ids(units: list[tuple[str, bytes]]) -> list[list[str]]:
    """For each unit ``(folder, its distinct 64-bit trajectory id hashes, ascending, as bytes)``, in merge order: the
    first earlier folder holding each of its hashes that an earlier unit holds, in hash order. One sort over every
    hash at the end, when the workers are gone: the merging process holds 8 bytes an id meanwhile, and no NumPy."""
    import numpy as np

    hashes = [np.frombuffer(raw, np.uint64) for _, raw in units]
    if not any(len(h) for h in hashes):
        return [[] for _ in units]
    value = np.concatenate(hashes)
    unit = np.repeat(np.arange(len(units)), [len(h) for h in hashes])
    order = np.lexsort((unit, value))
    value, unit = value[order], unit[order]
    first = np.r_[True, value[1:] != value[:-1]]
    first_unit = unit[np.maximum.accumulate(np.where(first, np.arange(len(value)), 0))]
    repeat = np.flatnonzero(~first)
    out: list[list[str]] = [[] for _ in units]
    for i in repeat[np.lexsort((value[repeat], unit[repeat]))].tolist():  # per unit, in hash order
        out[int(unit[i])].append(units[int(first_unit[i])][0])
    return out


@dataclass(kw_only=True)
class _Merged(Gathered):
    """The units' results folded together, in version order, before the report is frozen."""

    committed: list[bytes] = field(default_factory=list)
    """Per unit merged: its committed groups (``worker.UnitAudit.committed`` rows) as zlib-compressed JSON, a few
    dozen bytes a group while the workers run; ``committed_groups`` builds lineage's mapping once they are gone."""
    ids: list[tuple[str, bytes, int]] = field(default_factory=list)
    """Per unit merged: its folder, its trajectory id hashes and where in ``findings`` its duplicates go
    (``duplicates`` finds them once every unit is in)."""
    shards: int = 0

    def merge(self, raw: dict[str, Any]) -> None:
        """Fold in one unit's result (``worker.UnitAudit.to_plain``, or a kept one), a later folder than the last."""
        self.findings += [Finding(**f) for f in raw["findings"]]
        self.bad_files += [BadFile(**b) for b in raw["bad_files"]]
        self.schema_versions.update(raw["schema_versions"])
        for v, t in raw["by_version"].items():
            self.by_version[int(v)].add(Tally(**t))
        for w, t in raw["by_worker"].items():
            self.by_worker[w].add(Tally(**t))
        for name, pairs in raw["dists"].items():
            self.dists[name].counts.update({float(v): int(c) for v, c in pairs})
        self.statuses.update(raw["statuses"])
        self.tool_calls.update(raw["tool_calls"])
        self.tool_errors.update({(tool, kind): n for tool, kind, n in raw["tool_errors"]})
        self.committed.append(zlib.compress(json.dumps(raw["committed"], separators=(",", ":")).encode(), 1))
        self.ids.append((raw["id_folder"], base64.b64decode(raw["id_hashes"]), len(self.findings)))
        self.shards += raw["shards"]

    def committed_groups(self) -> dict[GroupKey, CommittedGroup]:
        return {(shard, gid): CommittedGroup(version=v, prompt_id=pid, row_start=a, row_end=b, usable=ok)
                for blob in self.committed for shard, gid, v, pid, a, b, ok in json.loads(zlib.decompress(blob))}

    def duplicates(self) -> None:
        """Add a ``duplicate_trajectory`` finding after each unit's own findings per trajectory id an earlier
        folder committed, naming the first such folder."""
        firsts = _duplicate_ids([(folder, raw) for folder, raw, _ in self.ids])
        findings, at = [], 0
        for (folder, _, end), unit_firsts in zip(self.ids, firsts, strict=True):
            findings += self.findings[at:end]
            findings += [Finding(kind="duplicate_trajectory", path=folder, row=None, trajectory_id=None,
                                 message=f"a trajectory id of this folder is also committed in {first}")
                         for first in unit_firsts]
            at = end
        self.findings[:] = findings + self.findings[at:]
        self.ids.clear()



def _reusable(store: Store, kept: list[tuple[int | None, str]], newest: int | None) -> dict[str, Any] | None:
    """A kept result of the same shards that still holds: audited with the same newest published version, or an
    older one when it found no untrainable group (a newer pointer only allows more policy versions)."""
    for then, path in kept:
        try:
            record = AuditVersionResult.at(store, path)
        except RecordError:
            continue  # a damaged kept result is only a cache miss
        same = then == newest
        older_and_clean = (then is not None and newest is not None and then < newest
                           and not any(f["kind"] == "untrainable_group" for f in record.result["findings"]))
        if same or older_and_clean:
            return record.result
    return None


def _keep(store: Store, unit: Unit, result: dict[str, Any]) -> None:
    record = AuditVersionResult(version=unit.version, digest=unit.digest, newest_version=unit.newest_version,
                                result=result)
    with contextlib.suppress(AlreadyExistsError):  # an earlier audit of the same shards kept it (create-only)
        record.write(store)


def _campaign(store: Store, findings: list[Finding]) -> dict[str, Any] | None:
    parsed = read_records(store, [layout.CAMPAIGN_JSON], CampaignManifest, 1, "bad_campaign_json", findings)
    return parsed[0][1].to_dict() if parsed else None


def _needs(campaign: dict[str, Any] | None, findings: list[Finding]) -> TrainerNeeds | None:
    """The trainer's needs from the config snapshot (``CampaignConfig.to_dict()``: its rollout, trainer and model
    sections); None (trainer checks skipped) for a folder that is not a training campaign (the synthetic demo) or
    records no config."""
    config = (campaign or {}).get("config")
    if not config or campaign.get("kind") != "campaign":
        return None
    try:
        return TrainerNeeds.of(group_size=int(config["rollout"]["group_size"]),
                               seq_buckets=[int(b) for b in config["trainer"]["seq_buckets"]],
                               max_seq_len=int(config["model"]["max_seq_len"]),
                               vocab_size=int(config["model"]["vocab_size"]),
                               # configs written before the trainer's shard limits existed: the defaults
                               max_shard_bytes=int(config["trainer"].get("max_shard_bytes", MAX_DECODED_BYTES)),
                               max_shard_rows=int(config["trainer"].get("max_shard_rows", MAX_SHARD_ROWS)))
    except (TypeError, ValueError, KeyError, IndexError) as e:
        findings.append(Finding(kind="bad_campaign_json", path=layout.CAMPAIGN_JSON, row=None, trajectory_id=None,
                                message=f"config does not load, trainer checks skipped: {e}"))
        return None


def _ancestry(chain: list[tuple[Store, ForkParent]], lineage: Lineage | None) -> tuple[Ancestor, ...]:
    """A fork's parents, nearest first, each with the versions up to its fork point: the campaign's own lineage
    already runs through them (a fork is audited over its parents' history, ``records.with_parents``)."""
    published = lineage.published if lineage is not None else ()
    return tuple(Ancestor(url=p.url, step=p.step, version=p.version,
                          published=tuple(v for v in published if v.version <= p.version)) for _, p in chain)


def _version_folder(path: str) -> bool:
    """A folder directly under ``trajectories/``: listed on its own, when its turn comes."""
    return path.startswith(_TRAJECTORIES) and "/" not in path[len(_TRAJECTORIES):]


def _foreign(path: str) -> BadFile:
    return BadFile(path=path, kind="foreign_name",
                   reason="not a shard name (trajectories/v<version:08d>/<worker>-<seq:08d>[-<groups>].arrow)")


def _is_temporary(path: str) -> bool:
    return TEMP_MARKER in path.rsplit("/", 1)[-1]


@dataclass(kw_only=True)
class _Listing:
    """What the first listing found: the objects outside the version folders, and the version folders' names.
    ``listed`` and ``temporaries`` grow as each version folder is listed in its turn (``_units``)."""

    store: Store
    """The campaign, read over its parents' history when it is a fork."""
    chain: list[tuple[Store, ForkParent]]
    files: list[str]
    folders: list[str]
    listed: int = 0
    temporaries: list[str] = field(default_factory=list)

    @property
    def over_parents(self) -> bool:
        """Whether the campaign is read over its parents' history (a fork whose ancestry could be followed)."""
        return bool(self.chain)

    @property
    def visible(self) -> list[str]:
        return [f for f in self.files if not _is_temporary(f)]


def _list(store: Store, findings: list[Finding]) -> _Listing:
    try:
        chain = records.fork_chain(store)
        store = records.with_parents(store)
    except ForkLineageError as e:  # the campaign is audited on its own folder
        chain = []
        findings.append(Finding(kind="fork_cycle" if isinstance(e, ForkLoopError) else "bad_fork_parent",
                                path=layout.CAMPAIGN_JSON, row=None, trajectory_id=None, message=str(e)))
    except RecordError:
        chain = []  # a campaign.json that does not read: ``_campaign`` reports it
    files = store.walk("", skip=_version_folder)  # the version folders' contents: one at a time, in ``_units``
    outside = set(files)
    folders = [name for name in store.list(layout.TRAJECTORIES, include_hidden=True)
               if f"{_TRAJECTORIES}{name}" not in outside]
    return _Listing(store=store, chain=chain, files=files, folders=folders, listed=len(files),
                    temporaries=[f for f in files if _is_temporary(f)])


def _version_objects(store: Store, folder: str, acc: _Merged) -> list[str]:
    """Every object under version folder ``folder``. A folder that cannot be listed is an ``unreadable`` bad file
    (its shards go unaudited), an empty folder inside it (named like a shard, say) a ``not_a_file`` one."""
    try:
        inside = store.walk(folder)
        names = store.list(folder, include_hidden=True)
    except StorageError as e:
        if storage_down(e):
            raise
        acc.bad_files.append(BadFile(path=folder, kind="unreadable", reason=f"the folder does not list: {e}"))
        return []
    held = {f[len(folder) + 1:].split("/", 1)[0] for f in inside}
    acc.bad_files += [BadFile(path=f"{folder}/{n}", kind="not_a_file", reason="an empty folder")
                      for n in names if n not in held]
    return inside


def _units(listing: _Listing, acc: _Merged, *, needs: TrainerNeeds | None, newest: int | None, read_ahead: int,
           since: int | None, reused: set[int]) -> Iterator[tuple[Unit, dict[str, Any] | None]]:
    """Each version folder listed in turn; its shards as a unit, with a kept result when one holds (its version
    then joins ``reused``). Names that are no shard's become ``foreign_name`` bad files in ``acc``."""
    store = listing.store
    kept = records.audit_version_results(store) if since is not None else {}
    for name in listing.folders:
        inside = _version_objects(store, f"{_TRAJECTORIES}{name}", acc)
        listing.listed += len(inside)
        listing.temporaries.extend(f for f in inside if _is_temporary(f))
        shards = []
        for f in inside:
            if not _is_temporary(f):
                sid = layout.parse_shard_path(f)
                if sid is None:
                    acc.bad_files.append(_foreign(f))
                else:
                    shards.append((sid, f))
        if not shards:
            continue
        shards.sort()
        unit = Unit(version=shards[0][0].version, url=store.url, storage_options=dict(store.storage_options),
                    shards=tuple(f for _, f in shards), needs=needs, newest_version=newest, read_ahead=read_ahead,
                    over_parents=listing.over_parents)
        result = None
        if since is not None and unit.version < since:
            result = _reusable(store, kept.get((unit.version, unit.digest), []), newest)
        if result is not None:
            reused.add(unit.version)
        yield unit, result


@dataclass(kw_only=True)
class _Progress:
    """The audit's progress lines: ``say`` one, with the time since ``start``; ``on_shards`` counts shards read
    and says so every ``every``."""

    url: str
    out: Callable[[str], None] | None
    every: int
    clock: Callable[[], float]
    start: float
    done: int = 0

    def say(self, what: str) -> None:
        if self.out is not None:
            self.out(f"audit {self.url}: {what} ({self.clock() - self.start:.1f} s)")

    def on_shards(self, n: int) -> None:
        before, self.done = self.done, self.done + n
        if self.done // self.every > before // self.every:
            self.say(f"{self.done} shards read")


def _lineage(store: Store, acc: _Merged, visible: list[str], entries: list[Publication],
             read_ahead: int, etas: EtaBounds) -> tuple[int, Lineage | None]:
    """The committed groups (their count) reconciled with the consumption logs, publications and the staleness
    bound each step trained under (``etas``); unreadable or misnamed logs, logs whose tail cursor does not apply
    and lineage's own findings join ``acc.findings``."""
    consumed = [f for f in visible if f.startswith(layout.CONSUMED + "/")]
    log_paths = [f for f in consumed if layout.parse_consumed_name(f.rsplit("/", 1)[-1]) is not None]
    acc.findings += [Finding(kind="bad_consumption_log", path=f, row=None, trajectory_id=None,
                             message="not a consumption log name (train/consumed/<step:08d>.json)")
                     for f in consumed if f not in log_paths]
    logs = read_records(store, log_paths, ConsumptionLog, read_ahead, "bad_consumption_log", acc.findings)
    acc.findings += cursor_findings(logs)
    committed = acc.committed_groups()
    acc.committed.clear()
    lineage, lineage_findings = reconcile(committed, logs, entries, etas)
    acc.findings += lineage_findings
    return len(committed), lineage


def audit_campaign(store: Store, *, progress: Callable[[str], None] | None = None, progress_every: int = 100,
                   read_ahead: int = 8, max_listed: int = 1000, jobs: int | None = 1, since: int | None = None,
                   keep: bool = False, unit_timeout_s: float = 3600.0, config_check: ConfigCheck | None = None,
                   clock: Callable[[], float] = time.monotonic) -> AuditReport:
    """Audit the campaign at ``store``, one version folder per work unit, in this process (``jobs`` = 1) or on
    ``jobs`` worker processes (None: as many as the campaign's size pays for, ``pool.auto_jobs``), each given at
    most ``unit_timeout_s`` a folder. Raises ``NotACampaignError`` when it
    has no ``campaign.json``, ``pool.AuditWorkerError`` when a worker dies or overruns.

    ``keep`` writes each folder's result under ``audit/versions/`` (``AuditVersionResult``); with ``since``,
    folders below that version reuse a kept result of the same shards instead of being read again.
    ``config_check`` loads the config snapshot as the stages do (``state.ConfigCheck``; None: not checked)."""
    if progress_every < 1 or read_ahead < 1 or (jobs is not None and jobs < 1) or not unit_timeout_s > 0:
        raise ValueError(f"progress_every, read_ahead and jobs must be >= 1 and unit_timeout_s > 0, got "
                         f"{progress_every}, {read_ahead}, {jobs}, {unit_timeout_s}")
    start = clock()
    if not store.exists(layout.CAMPAIGN_JSON):
        raise NotACampaignError("audit", store.url, f"not a campaign (no {layout.CAMPAIGN_JSON})")
    acc = _Merged()
    listing = _list(store, acc.findings)
    store = listing.store
    said = _Progress(url=store.url, out=progress, every=progress_every, clock=clock, start=start)
    said.say(f"{len(listing.files)} objects and {len(listing.folders)} trajectory folder(s) listed")
    campaign = _campaign(store, acc.findings)
    acc.findings += config_findings(campaign, config_check)
    needs = _needs(campaign, acc.findings)
    training = campaign is not None and campaign.get("kind") == "campaign"
    visible = listing.visible
    # Pointer entries first: the newest published version bounds the policy versions a shard may carry.
    entries = pointer_entries(store, read_ahead, acc.findings, training=training)
    newest = max((e.version for e in entries), default=None)
    acc.bad_files += [_foreign(f) for f in visible if f.startswith(_TRAJECTORIES)]  # not in a version folder
    reused: set[int] = set()
    units = _units(listing, acc, needs=needs, newest=newest, read_ahead=read_ahead, since=since, reused=reused)
    merged = 0
    for unit, result in results(store, units, jobs, unit_timeout_s, said.on_shards):  # in version order
        if keep and unit.version not in reused:
            _keep(store, unit, result)
        acc.merge(result)
        merged += 1
    said.say(f"{said.done} shards read in {merged} version folder(s)")
    if progress is not None and since is not None:
        progress(f"audit {store.url}: reused the kept results of {len(reused)} version folder(s) below {since}")
    acc.duplicates()
    etas = eta_bounds(campaign, [p for _, p in listing.chain], acc.findings)
    groups, lineage = _lineage(store, acc, visible, entries, read_ahead, etas)
    acc.findings += checkpoint_findings(store, read_ahead) + eval_findings(store, read_ahead)
    return _report(store, acc, listing, groups=groups, lineage=lineage, campaign=campaign,
                   seconds=clock() - start, max_listed=max_listed)


def _report(store: Store, acc: _Merged, listing: _Listing, *, groups: int, lineage: Lineage | None,
            campaign: dict[str, Any] | None, seconds: float, max_listed: int) -> AuditReport:
    findings = acc.findings
    dists = {name: acc.dists[name].summary() for name in ("reward", "tokens", "generated_tokens", "turns")}
    tool_errors: dict[str, dict[str, int]] = defaultdict(dict)
    for (tool, kind), n in sorted(acc.tool_errors.items()):
        tool_errors[tool][kind] = n
    return AuditReport(
        url=store.url,
        audited_at=utc_now_iso(),
        seconds=seconds,
        files=listing.listed,
        shards=acc.shards,
        trajectories=sum(t.trajectories for t in acc.by_version.values()),
        groups=groups,
        by_version={v: t.counts() for v, t in sorted(acc.by_version.items())},
        by_worker={w: t.counts() for w, t in sorted(acc.by_worker.items())},
        schema_versions=dict(sorted(acc.schema_versions.items())),
        violation_counts=dict(sorted(Counter(f.kind for f in findings).items())),
        violations=tuple(findings[:max_listed]),
        bad_files=tuple(sorted(acc.bad_files, key=lambda b: b.path)),
        orphaned_temporaries=tuple(sorted(listing.temporaries)),
        statuses=dict(sorted(acc.statuses.items())),
        tool_calls=dict(sorted(acc.tool_calls.items())),
        tool_errors=dict(tool_errors),
        lineage=lineage,
        campaign=campaign,
        evals=tuple(layout.eval_path(v) for v in records.evaluated_versions(store)),
        ancestry=_ancestry(listing.chain, lineage),
        **dists,
    )
