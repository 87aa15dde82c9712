"""The records a campaign resumes from, checked the way the stages that restore from them read them.

A restarted trainer restores its newest committed checkpoint and replays the consumption logs after it; rollout
workers and evaluation load what ``weights/LATEST`` names; ``recover`` and every stage load the config snapshot.
Damage to any of these stops a restart, so the audit reports each as a finding (never an error), and ``recover``
refuses a campaign with any of them before it starts a stage (``state_findings``):

- ``pointer_entries``: the valid ``weights/LATEST`` entries; any other object there (a stray name, content that
  disagrees with its name, a non-record) is a ``bad_pointer_entry`` (readers skip it), and so, in a training
  campaign, is an entry whose ``path`` is not its version's weights folder or whose version has no committed
  weights (no ``PUBLISHED.json``).
- ``checkpoint_findings``: a committed checkpoint (``COMMITTED`` present) holds its Orbax ``state/`` and a
  ``meta.json`` that reads as ``CheckpointMeta`` of the folder's step with a tail cursor that parses
  (``bad_checkpoint``).
- ``cursor_findings``: each consumption log's tail cursor (delta) parses (``bad_consumption_log``).
- ``eval_findings``: each ``eval/v<N>.json`` reads as the ``EvalResult`` of version N (``bad_eval``).
- ``config_findings``: the config snapshot of a training campaign loads as the stages load it. The check is the
  caller's (``ConfigCheck``): the config imports the model code, which the audit's process never loads.

``read_records`` is the one reader of a listed record for all of them: an object that is missing, not a regular
file, larger than a record may be or not the record becomes a finding of the given kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from pipelines_lib import records
from pipelines_lib.audit.report import Finding
from pipelines_lib.audit.unit import prefetch
from pipelines_lib.records import CheckpointMeta, ConsumptionLog, EvalResult, Publication, Record, RecordError
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import MAX_JSON_BYTES, StorageError
from pipelines_lib.storage.layout import pointer_entry_problem
from pipelines_lib.storage.store import TEMP_MARKER, Store
from pipelines_lib.trajectory.cursor import TailCursor

R = TypeVar("R", bound=Record)
ConfigCheck = Callable[[dict[str, Any]], str | None]
"""Why a config snapshot does not load as the stages load it (None: it loads)."""
POINTER_ENTRIES = f"{layout.WEIGHTS_LATEST}.d"


def _finding(kind: str, path: str, message: str) -> Finding:
    return Finding(kind=kind, path=path, row=None, trajectory_id=None, message=message)


def read_records(store: Store, paths: list[str], cls: type[R], read_ahead: int, kind: str,
                 findings: list[Finding]) -> list[tuple[str, R]]:
    """Records ``cls`` at ``paths`` (in order); unreadable or invalid ones become findings of ``kind``."""
    out = []
    for path, data in prefetch(store, paths, read_ahead, max_bytes=MAX_JSON_BYTES):
        try:
            if isinstance(data, StorageError):
                raise RecordError(str(data))
            out.append((path, cls.from_bytes(data, where=path)))
        except RecordError as e:
            findings.append(_finding(kind, path, str(e)))
    return out


def pointer_entries(store: Store, read_ahead: int, findings: list[Finding], *, training: bool) -> list[Publication]:
    """The valid entries of the ``weights/LATEST`` pointer; every other object among them is a ``bad_pointer_entry``
    finding. ``training``: the campaign publishes real weights (the synthetic demo has none)."""
    paths = [f"{POINTER_ENTRIES}/{n}" for n in store.list(POINTER_ENTRIES, include_hidden=True)
             if TEMP_MARKER not in n]
    bad: list[Finding] = []
    entries = []
    for path, entry in read_records(store, paths, Publication, read_ahead, "bad_pointer_entry", bad):
        problem = pointer_entry_problem(path.rsplit("/", 1)[-1], entry.to_dict())
        if problem is None and training:
            problem = _weights_problem(store, entry)
        if problem is None:
            entries.append(entry)
        else:
            bad.append(_finding("bad_pointer_entry", path, problem))
    findings += sorted((dataclasses.replace(f, message=f"{f.message} (readers skip it)") for f in bad),
                       key=lambda f: f.path)
    return entries


def _weights_problem(store: Store, entry: Publication) -> str | None:
    folder = layout.weights_dir(entry.version)
    if entry.path != folder:
        return f"path {entry.path!r} is not version {entry.version}'s weights folder {folder}"
    if not Publication.exists(store, entry.version):
        return f"version {entry.version} has no committed weights (no {Publication.path_of(entry.version)})"
    return None


def _cursor_problem(text: str, parse: Callable[[str], TailCursor]) -> str | None:
    try:
        parse(text)
    except (ValueError, RecursionError) as e:
        return str(e) if isinstance(e, ValueError) else "tail cursor nested too deeply"
    return None


def checkpoint_findings(store: Store, read_ahead: int) -> list[Finding]:
    """A ``bad_checkpoint`` finding per committed checkpoint a trainer could not restore."""
    findings: list[Finding] = []
    folders = records.committed_checkpoints(store)
    metas = dict(read_records(store, [layout.checkpoint_meta(f) for f in folders], CheckpointMeta, read_ahead,
                              "bad_checkpoint", findings))
    for folder in folders:
        meta = metas.get(layout.checkpoint_meta(folder))
        if not store.list(f"{folder}/state", include_hidden=True):
            findings.append(_finding("bad_checkpoint", folder, "committed without its Orbax state (state/ is empty "
                                                               "or missing)"))
        if meta is None:
            continue
        if meta.step != layout.checkpoint_step(folder):
            findings.append(_finding("bad_checkpoint", layout.checkpoint_meta(folder),
                                     f"step {meta.step} in the checkpoint of step {layout.checkpoint_step(folder)}"))
        if (problem := _cursor_problem(meta.cursor, TailCursor.from_json)) is not None:
            findings.append(_finding("bad_checkpoint", layout.checkpoint_meta(folder), problem))
    return findings


def cursor_findings(logs: list[tuple[str, ConsumptionLog]]) -> list[Finding]:
    """A ``bad_consumption_log`` finding per log whose tail cursor a resuming trainer could not apply."""
    out = []
    for path, log in logs:
        if log.cursor_after is not None:
            problem = _cursor_problem(log.cursor_after, TailCursor.from_json)
        else:
            problem = None if log.cursor_delta is None else _cursor_problem(log.cursor_delta, TailCursor().after)
        if problem is not None:
            out.append(_finding("bad_consumption_log", path, problem))
    return out


def eval_findings(store: Store, read_ahead: int) -> list[Finding]:
    """A ``bad_eval`` finding per evaluation record that does not read as its version's ``EvalResult``."""
    findings: list[Finding] = []
    paths = [layout.eval_path(v) for v in records.evaluated_versions(store)]
    for path, result in read_records(store, paths, EvalResult, read_ahead, "bad_eval", findings):
        if path != layout.eval_path(result.version):
            findings.append(_finding("bad_eval", path, f"holds the evaluation of version {result.version}"))
    return findings


def config_findings(campaign: dict[str, Any] | None, check: ConfigCheck | None) -> list[Finding]:
    """A ``bad_campaign_json`` finding when a training campaign's config snapshot does not load."""
    if check is None or campaign is None or campaign.get("kind") != "campaign":
        return []
    problem = check(campaign.get("config") or {})
    return [] if problem is None else [_finding("bad_campaign_json", layout.CAMPAIGN_JSON,
                                                f"config does not load: {problem}")]


def state_findings(store: Store, check: ConfigCheck, *, read_ahead: int = 8) -> list[Finding]:
    """Every finding above for the campaign at ``store`` (read over its parents' history), for a command that
    must not resume a damaged campaign."""
    findings: list[Finding] = []
    manifest = read_records(store, [layout.CAMPAIGN_JSON], records.CampaignManifest, 1, "bad_campaign_json",
                            findings)
    campaign = manifest[0][1].to_dict() if manifest else None
    findings += config_findings(campaign, check)
    training = campaign is not None and campaign.get("kind") == "campaign"
    pointer_entries(store, read_ahead, findings, training=training)
    findings += checkpoint_findings(store, read_ahead)
    paths = [layout.consumed_log(s) for s in records.consumption_steps(store)]
    findings += cursor_findings(read_records(store, paths, ConsumptionLog, read_ahead, "bad_consumption_log",
                                             findings))
    return findings + eval_findings(store, read_ahead)
