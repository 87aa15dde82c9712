"""Names of everything in a campaign folder (DESIGN §2). Stages build paths only through these functions.

```
campaign.json
dataset/<split>.arrow, dataset/_SUCCESS
trajectories/v<policy_version:08d>/<worker_id>-<seq:08d>.arrow
train/checkpoints/<step:08d>/           train/consumed/<step:08d>.json
weights/v<version:08d>/                  weights/LATEST.json (+ LATEST.json.d/, the pointer's entries)
eval/v<version:08d>.json                 train/DONE.json
audit/, telemetry/
```
Names sort in commit order and never collide: worker ids are unique per process start and ``seq`` counts
that worker's shards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CAMPAIGN_JSON = "campaign.json"
TRAJECTORIES = "trajectories"
WEIGHTS_LATEST = "weights/LATEST.json"
TRAIN_DONE = "train/DONE.json"
DATASET_SUCCESS = "dataset/_SUCCESS"
ROLLOUT_STOPS = "rollout"
"""``rollout/STOP-<utc>.json`` markers: rollout workers started before such a marker stop (the campaign writes
one when its trainer fails for good, so in-process workers do not run forever); later workers ignore it."""

_WORKER_RE = re.compile(r"^[A-Za-z0-9_.]+$")
_SHARD_RE = re.compile(r"^(?P<worker>[A-Za-z0-9_.]+)-(?P<seq>\d{8})\.arrow$")
_VERSION_RE = re.compile(r"^v(?P<version>\d{8})$")
_EVAL_RE = re.compile(r"^v(?P<n>\d{8})\.json$")
_CONSUMED_RE = re.compile(r"^(?P<n>\d{8})\.json$")
_CHECKPOINT_RE = re.compile(r"^(?P<n>\d{8})(\.\d+)?$")


def campaign_id(url: str) -> str:
    """A campaign's id: the name of its folder (``gs://b/campaigns/exp7`` -> ``exp7``)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def check_worker_id(worker_id: str) -> str:
    if not _WORKER_RE.match(worker_id):
        raise ValueError(f"worker_id may only use letters, digits, '_' and '.', got {worker_id!r}")
    return worker_id


def version_dir(version: int) -> str:
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return f"{TRAJECTORIES}/v{version:08d}"


def shard_name(worker_id: str, seq: int) -> str:
    return f"{check_worker_id(worker_id)}-{seq:08d}.arrow"


def shard_path(version: int, worker_id: str, seq: int) -> str:
    return f"{version_dir(version)}/{shard_name(worker_id, seq)}"


def parse_version_dir(name: str) -> int | None:
    m = _VERSION_RE.match(name)
    return int(m["version"]) if m else None


@dataclass(frozen=True, order=True)
class ShardId:
    """A committed shard: sorts by version, then worker, then seq."""

    version: int
    worker_id: str
    seq: int

    @property
    def path(self) -> str:
        return shard_path(self.version, self.worker_id, self.seq)

    @property
    def name(self) -> str:
        return shard_name(self.worker_id, self.seq)


def parse_shard_path(path: str) -> ShardId | None:
    """``ShardId`` of ``trajectories/vNNNNNNNN/<worker>-<seq>.arrow``, or None for any other name."""
    parts = path.strip("/").split("/")
    if len(parts) != 3 or parts[0] != TRAJECTORIES:
        return None
    version = parse_version_dir(parts[1])
    m = _SHARD_RE.match(parts[2])
    if version is None or m is None:
        return None
    return ShardId(version, m["worker"], int(m["seq"]))


def checkpoint_dir(step: int) -> str:
    return f"train/checkpoints/{step:08d}"


def consumed_log(step: int) -> str:
    return f"train/consumed/{step:08d}.json"


def weights_dir(version: int) -> str:
    return f"weights/v{version:08d}"


def eval_path(version: int) -> str:
    return f"eval/v{version:08d}.json"


def parse_name(kind: str, name: str) -> int | None:
    """The number in a name under ``eval/`` (``v<version:08d>.json``), ``train/consumed/`` (``<step:08d>.json``)
    or ``train/checkpoints/`` (``<step:08d>[.<attempt>]``); None for any other name (garbage is not an error)."""
    m = {"eval": _EVAL_RE, "consumed": _CONSUMED_RE, "checkpoint": _CHECKPOINT_RE}[kind].match(name)
    return int(m["n"]) if m else None


def stop_marker(utc_compact: str) -> str:
    return f"{ROLLOUT_STOPS}/STOP-{utc_compact}.json"


def dataset_split(split: str) -> str:
    return f"dataset/{split}.arrow"
