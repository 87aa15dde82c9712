"""Campaign-level state read from the folder itself: ``campaign.json`` and what each stage has committed.

``init_campaign`` writes the config snapshot once (create-only; a rerun with the same config is a no-op, a
different config is refused: one URL, one experiment). ``campaign_status`` reads only markers and pointers and
says, per stage, whether it is done, partial or missing — the recover flow runs exactly the stages it lists.
Names that are not what a stage writes (a stray ``eval/notes.json``) are ignored and listed under ``ignored``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from pipelines_lib.config import CampaignConfig
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.store import Store
from pipelines_lib.train.checkpoint import committed_checkpoints
from pipelines_lib.trajectory.record import utc_now_iso
from pipelines_lib.trajectory.schema import SCHEMA_VERSION


class CampaignMismatchError(ValueError):
    """The campaign folder holds a different config than the one given."""


def code_version() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def init_campaign(store: Store, config: CampaignConfig) -> dict[str, Any]:
    snapshot = {"schema_version": SCHEMA_VERSION, "code_version": code_version(), "created_at": utc_now_iso(),
                "config": config.to_dict()}
    try:
        store.create_json(layout.CAMPAIGN_JSON, snapshot)
        return {"campaign": store.url, "created": True}
    except AlreadyExistsError:
        existing = store.read_json(layout.CAMPAIGN_JSON)
        if existing.get("config") != config.to_dict():
            theirs, ours = existing.get("config", {}), config.to_dict()
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise CampaignMismatchError(
                f"{store.uri(layout.CAMPAIGN_JSON)}: this campaign was started with a different config "
                f"(sections differing: {diff}); use a new campaign URL, or the campaign's own config") from None
        return {"campaign": store.url, "created": False}


def load_campaign_config(store: Store) -> CampaignConfig:
    if not store.exists(layout.CAMPAIGN_JSON):
        raise FileNotFoundError(f"{store.uri(layout.CAMPAIGN_JSON)}: not a campaign folder (no campaign.json)")
    return CampaignConfig.from_mapping(store.read_json(layout.CAMPAIGN_JSON)["config"])


def published_versions(store: Store) -> list[int]:
    """Versions with a pointer entry (by name; ``read_pointer`` and the audit also check the content)."""
    return sorted(v for n in store.list(f"{layout.WEIGHTS_LATEST}.d")
                  if (v := _entry_version(n)) is not None)


def _entry_version(name: str) -> int | None:
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and len(stem) == 12 and stem.isdigit() else None


def _numbered(store: Store, folder: str, kind: str, ignored: list[str]) -> list[int]:
    out = []
    for name in store.list(folder):
        n = layout.parse_name(kind, name)
        if n is None:
            ignored.append(f"{folder}/{name}")
        else:
            out.append(n)
    return sorted(out)


def campaign_status(store: Store) -> dict[str, Any]:
    """What each stage has committed; ``todo`` lists the stages a recovery must run, in order."""
    ignored: list[str] = [f"{layout.WEIGHTS_LATEST}.d/{n}" for n in store.list(f"{layout.WEIGHTS_LATEST}.d")
                          if _entry_version(n) is None]
    versions = published_versions(store)
    evaluated = _numbered(store, "eval", "eval", ignored)
    steps = _numbered(store, "train/consumed", "consumed", ignored)
    checkpoints = committed_checkpoints(store)
    ignored += [f"train/checkpoints/{n}" for n in store.list("train/checkpoints")
                if layout.parse_name("checkpoint", n) is None]
    status = {
        "campaign": store.exists(layout.CAMPAIGN_JSON),
        "dataset": store.exists(layout.DATASET_SUCCESS),
        "warm_start": 0 in versions,
        "train_done": store.exists(layout.TRAIN_DONE),
        "train_steps": steps[-1] if steps else 0,
        "latest_checkpoint": checkpoints[-1] if checkpoints else None,
        "published_versions": versions,
        "evaluated_versions": evaluated,
        "missing_eval": [v for v in versions if v not in evaluated],
        "shards": sum(len(store.list(f"{layout.TRAJECTORIES}/{d}")) for d in store.list(layout.TRAJECTORIES)),
        "ignored": ignored,
    }
    todo = []
    for stage, done in (("init", status["campaign"]), ("prep", status["dataset"]),
                        ("warm_start", status["warm_start"]), ("train", status["train_done"])):
        if not done:
            todo.append(stage)
    if not status["train_done"]:
        todo.insert(todo.index("train"), "collect")
    if status["missing_eval"] or not status["train_done"]:
        todo.append("evaluate")
    todo.append("audit")
    status["todo"] = todo
    return status
