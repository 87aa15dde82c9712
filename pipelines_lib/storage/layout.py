"""Names of everything in a campaign folder (ARCHITECTURE §2). Stages build paths only through these functions.

```
campaign.json
dataset/<split>.arrow, dataset/_SUCCESS
trajectories/v<policy_version:08d>/<worker_id>-<seq:08d>-<groups>.arrow   (older shards: <worker_id>-<seq:08d>.arrow)
train/checkpoints/<step:08d>[.<attempt>]/{state/, meta.json, COMMITTED}
train/consumed/<step:08d>.json           train/DONE.json
weights/v<version:08d>/{state/, model_config.json, PUBLISHED.json}
weights/LATEST.json (+ LATEST.json.d/, the pointer's entries)
eval/v<version:08d>.json                 rollout/STOP-<utc>.json
runs/<key>-<flow_run_id>[-failed-<attempt>].json
audit/<utc>.json, audit/<utc>.txt        telemetry/
audit/versions/v<version:08d>-<shards digest>-<newest published>.json   one version folder's audit result
heal/<attempt:04d>.json                  one automatic recovery after a crash (or its refusal: budget spent)
```
What each JSON object holds is a typed record in ``pipelines_lib.records``. A fork's folder holds only what it
wrote; ``inherited`` names the parent's objects it reads as its own (``storage.forked``).
Names sort in commit order and never collide: worker ids are unique per process start and ``seq`` counts
that worker's shards.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass, field
from typing import Any

CAMPAIGN_JSON = "campaign.json"
TRAJECTORIES = "trajectories"
WEIGHTS_LATEST = "weights/LATEST.json"
TRAIN_DONE = "train/DONE.json"
DATASET_SUCCESS = "dataset/_SUCCESS"
CONSUMED = "train/consumed"
CHECKPOINTS = "train/checkpoints"
CHECKPOINT_COMMITTED = "COMMITTED"
"""Empty object written last in a checkpoint folder: only committed checkpoints exist for readers."""
PUBLISHED = "PUBLISHED.json"
"""Commit marker inside a weights folder, created after the Orbax item and config are complete."""
EVAL = "eval"
RUNS = "runs"
AUDIT = "audit"
TELEMETRY = "telemetry"
HEAL = "heal"
ROLLOUT_STOPS = "rollout"
"""``rollout/STOP-<utc>.json`` markers: rollout workers started before such a marker stop (the campaign writes
one when its trainer fails for good, so in-process workers do not run forever); later workers ignore it."""

_WORKER = r"[A-Za-z0-9_][A-Za-z0-9_.]*"
"""A worker id: letters, digits, '_' and '.', never first: a name starting with '.' is hidden from every listing
(temporaries are), so its shards would be committed and never read."""
_WORKER_RE = re.compile(rf"^{_WORKER}$")
_SHARD_RE = re.compile(rf"^(?P<worker>{_WORKER})-(?P<seq>\d{{8}})(?:-(?P<groups>\d+))?\.arrow$")
_VERSION_RE = re.compile(r"^v(?P<version>\d{8})$")
_CONSUMED_RE = re.compile(r"^(?P<step>\d{8})\.json$")
_EVAL_RE = re.compile(r"^v(?P<version>\d{8})\.json$")
_CHECKPOINT_RE = re.compile(r"^(?P<step>\d{8})(\.\d+)?$")
_STOP_RE = re.compile(r"^STOP-(?P<utc>[0-9TZ]+)\.json$")
_HEAL_RE = re.compile(r"^(?P<attempt>\d{4})\.json$")
_POINTER_ENTRY_RE = re.compile(r"^(?P<value>\d{12})\.json$")


def parse_pointer_entry(name: str) -> int | None:
    """The value a pointer entry's name carries (``000000000007.json`` -> 7); None for any other name."""
    m = _POINTER_ENTRY_RE.match(name)
    return None if m is None else int(m["value"])


def pointer_entry_problem(name: str, payload: Any, *, key: str = "version") -> str | None:
    """Why pointer entry ``name`` holding ``payload`` must not count (None: it is valid)."""
    named = parse_pointer_entry(name)
    if named is None:
        return "not a pointer entry name (<value:012d>.json)"
    if not isinstance(payload, dict):
        return f"content is {type(payload).__name__}, not a JSON object"
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{key!r} must be an integer >= 0, got {value!r}"
    if value != named:
        return f"name says {key} {named}, content says {value}"
    return None


def campaign_id(url: str) -> str:
    """A campaign's id: the name of its folder (``gs://b/campaigns/exp7`` -> ``exp7``)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def check_worker_id(worker_id: str) -> str:
    if not _WORKER_RE.match(worker_id):
        raise ValueError(f"worker_id may only use letters, digits, '_' and '.' (not first), got {worker_id!r}")
    return worker_id


def version_dir(version: int) -> str:
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return f"{TRAJECTORIES}/v{version:08d}"


def shard_name(worker_id: str, seq: int, groups: int | None = None) -> str:
    """``<worker>-<seq:08d>-<groups>.arrow``: the number of groups in the name lets a reader account for a shard
    it never opens (the trainer's tailer, when its window moves past a version). ``groups=None`` gives the older
    name without it, which still reads."""
    count = "" if groups is None else f"-{groups}"
    return f"{check_worker_id(worker_id)}-{seq:08d}{count}.arrow"


def shard_path(version: int, worker_id: str, seq: int, groups: int | None = None) -> str:
    return f"{version_dir(version)}/{shard_name(worker_id, seq, groups)}"


def parse_version_dir(name: str) -> int | None:
    m = _VERSION_RE.match(name)
    return int(m["version"]) if m else None


@dataclass(frozen=True, order=True)
class ShardId:
    """A committed shard: sorts by version, then worker, then seq."""

    version: int
    worker_id: str
    seq: int
    groups: int | None = field(default=None, compare=False)
    """Number of groups its name declares (None: an older name without it). Not part of the identity: a
    writer's (version, seq) names one shard; readers check the count against the content."""

    @functools.cached_property
    def path(self) -> str:  # asked for on every step of a shard through the tailer: built once
        return shard_path(self.version, self.worker_id, self.seq, self.groups)

    @property
    def name(self) -> str:
        return shard_name(self.worker_id, self.seq, self.groups)


def parse_shard_path(path: str) -> ShardId | None:
    """``ShardId`` of ``trajectories/vNNNNNNNN/<worker>-<seq>[-<groups>].arrow``, or None for any other name."""
    parts = path.strip("/").split("/")
    if len(parts) != 3 or parts[0] != TRAJECTORIES:
        return None
    version = parse_version_dir(parts[1])
    m = _SHARD_RE.match(parts[2])
    if version is None or m is None:
        return None
    return ShardId(version, m["worker"], int(m["seq"]), None if m["groups"] is None else int(m["groups"]))


def checkpoint_dir(step: int, attempt: int = 0) -> str:
    """Folder of a checkpoint of ``step``; ``attempt`` > 0 after crashed saves left earlier folders."""
    return f"{CHECKPOINTS}/{step:08d}" + (f".{attempt}" if attempt else "")


def checkpoint_step(folder: str) -> int | None:
    """Step of a checkpoint folder (``train/checkpoints/<step>[.<attempt>]`` or its last name), else None."""
    m = _CHECKPOINT_RE.match(folder.rstrip("/").rsplit("/", 1)[-1])
    return int(m["step"]) if m else None


def checkpoint_meta(folder: str) -> str:
    return f"{folder}/meta.json"


def checkpoint_committed(folder: str) -> str:
    return f"{folder}/{CHECKPOINT_COMMITTED}"


def consumed_log(step: int) -> str:
    return f"{CONSUMED}/{step:08d}.json"


def parse_consumed_name(name: str) -> int | None:
    """Step of a consumption log's name (``<step:08d>.json``), or None for any other name."""
    m = _CONSUMED_RE.match(name)
    return int(m["step"]) if m else None


def weights_dir(version: int) -> str:
    return f"weights/v{version:08d}"


def published_marker(version: int) -> str:
    return f"{weights_dir(version)}/{PUBLISHED}"


def eval_path(version: int) -> str:
    return f"{EVAL}/v{version:08d}.json"


def parse_eval_name(name: str) -> int | None:
    """Version of an evaluation's name (``v<version:08d>.json``), or None for any other name."""
    m = _EVAL_RE.match(name)
    return int(m["version"]) if m else None


def stop_marker(utc_compact: str) -> str:
    return f"{ROLLOUT_STOPS}/STOP-{utc_compact}.json"


def parse_stop_name(name: str) -> str | None:
    """The compact UTC time of a stop marker's name, or None for any other name."""
    m = _STOP_RE.match(name)
    return m["utc"] if m else None


def heal_attempt(attempt: int) -> str:
    if not 1 <= attempt <= 9999:
        raise ValueError(f"heal attempt must be in 1..9999, got {attempt}")
    return f"{HEAL}/{attempt:04d}.json"


def parse_heal_name(name: str) -> int | None:
    """The attempt number of a heal record's name, or None for any other name."""
    m = _HEAL_RE.match(name)
    return int(m["attempt"]) if m else None


def run_record(key: str, flow_run_id: str, *, failed_attempt: str | None = None) -> str:
    """Record of one stage run in a flow run; a failed attempt gets its own name so the success can follow."""
    suffix = "" if failed_attempt is None else f"-failed-{failed_attempt}"
    return f"{RUNS}/{key}-{flow_run_id}{suffix}.json"


def utc_compact_of(iso: str) -> str:
    """``2026-01-02T03:04:05.678901+00:00`` → ``20260102T030405.678901Z``: an ISO time as a sortable name."""
    return dt.datetime.fromisoformat(iso).strftime("%Y%m%dT%H%M%S.%fZ")


def audit_report(utc_compact: str, ext: str = "json") -> str:
    return f"{AUDIT}/{utc_compact}.{ext}"


_AUDIT_REPORT_RE = re.compile(r"^\d{8}T\d{6}\.\d{6}Z\.json$")


def is_audit_report(name: str) -> bool:
    """Whether ``name`` (in ``audit/``) is a kept audit's JSON (``audit_report``); the names sort by time."""
    return bool(_AUDIT_REPORT_RE.match(name))


AUDIT_VERSIONS = f"{AUDIT}/versions"
_AUDIT_VERSION_RE = re.compile(r"^v(?P<version>\d{8})-(?P<digest>[0-9a-f]{16})-(?P<newest>\d+|none)\.json$")


def audit_version_result(version: int, digest: str, newest: int | None) -> str:
    """One version folder's audit result, for the shards whose names hash to ``digest`` with ``newest`` the newest
    published version then (an incremental audit reuses it while those have not changed)."""
    return f"{AUDIT_VERSIONS}/v{version:08d}-{digest}-{'none' if newest is None else newest}.json"


def parse_audit_version_result(name: str) -> tuple[int, str, int | None] | None:
    """(version, digest, newest) of an ``audit_version_result`` name, or None for any other name."""
    m = _AUDIT_VERSION_RE.match(name)
    if m is None:
        return None
    return int(m["version"]), m["digest"], None if m["newest"] == "none" else int(m["newest"])


def telemetry_file(name: str) -> str:
    return f"{TELEMETRY}/{name}"


TENSORBOARD = f"{TELEMETRY}/tb"
"""TensorBoard's log folder: one run folder per recording process (``tensorboard --logdir <campaign>/telemetry/tb``)."""


def tensorboard_file(process: str, name: str) -> str:
    return f"{TENSORBOARD}/{process}/events.out.tfevents.{name}"


def dataset_split(split: str) -> str:
    return f"dataset/{split}.arrow"


def _at_most(number: int | None, bound: int) -> bool:
    return number is not None and number <= bound


def inherited(rel: str, *, step: int, version: int) -> bool:
    """Whether a fork from ``step`` (policy ``version`` then) reads ``rel`` from its parent when it has no object
    there itself: the parent's history up to the fork point, and the folders holding it.

    ``dataset/``; shards of versions <= ``version`` (those the parent had not trained on at ``step`` included);
    consumption logs and checkpoints of steps <= ``step``; published versions, their ``weights/LATEST`` entries
    and their evaluations up to ``version``. Never ``campaign.json``, the ``LATEST.json`` mirror, ``DONE.json``,
    runs, audits, telemetry or stop markers: those are each campaign's own."""
    parts = [p for p in rel.strip("/").split("/") if p]
    if len(parts) <= 1:
        return not parts or parts[0] in ("dataset", TRAJECTORIES, "train", "weights", EVAL)
    top, name = parts[0], parts[1]
    if top == "dataset":
        return True
    if top == TRAJECTORIES:
        return _at_most(parse_version_dir(name), version)
    if f"{top}/{name}" == CONSUMED:
        return len(parts) == 2 or _at_most(parse_consumed_name(parts[2]), step)
    if f"{top}/{name}" == CHECKPOINTS:
        return len(parts) == 2 or _at_most(checkpoint_step(parts[2]), step)
    if f"{top}/{name}" == f"{WEIGHTS_LATEST}.d":
        return len(parts) == 2 or _at_most(parse_pointer_entry(parts[2]), version)
    if top == "weights":
        return _at_most(parse_version_dir(name), version)
    if top == EVAL:
        return _at_most(parse_eval_name(name), version)
    return False
