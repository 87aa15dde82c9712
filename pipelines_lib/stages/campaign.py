"""Campaign-level state read from the folder itself: ``campaign.json`` and what each stage has committed.

``init_campaign`` writes the config snapshot once (create-only; a rerun with the same config is a no-op, a
different config is refused: one URL, one experiment). ``campaign_status`` reads only markers and pointers;
its ``todo`` lists the stages of the stage table whose marker record is missing, which is exactly what the
recover flow runs. ``claim_heal_attempt`` numbers the automatic recoveries after crashes (``heal/``), so a
campaign that keeps crashing stops being recovered once its budget is spent; ``campaign_status`` shows them.
Names that are not what a stage writes (a stray ``eval/notes.json``) are ignored and listed under ``ignored``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines_lib import records
from pipelines_lib.configio import ConfigError
from pipelines_lib.records import (
    CampaignManifest,
    DatasetSuccess,
    DoneMarker,
    HealAttempt,
    committed_checkpoints,
)
from pipelines_lib.stages.table import STAGES
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.store import Store
from pipelines_lib.utc import utc_now_iso

if TYPE_CHECKING:
    from pipelines_lib.config import CampaignConfig


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
    # imported here: Arrow, which `rollstream status` (campaign_status) does not need
    from pipelines_lib.trajectory.schema import SCHEMA_VERSION

    snapshot = CampaignManifest(schema_version=SCHEMA_VERSION, code_version=code_version(), created_at=utc_now_iso(),
                                config=config.to_dict())
    try:
        snapshot.write(store)
        return {"campaign": store.url, "created": True}
    except AlreadyExistsError:
        existing = CampaignManifest.read(store)
        if existing.config != config.to_dict():
            theirs, ours = existing.config, config.to_dict()
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise CampaignMismatchError(
                f"{store.uri(layout.CAMPAIGN_JSON)}: this campaign was started with a different config "
                f"(sections differing: {diff}); use a new campaign URL, or the campaign's own config") from None
        return {"campaign": store.url, "created": False}


def load_campaign_config(store: Store) -> CampaignConfig:
    if not store.exists(layout.CAMPAIGN_JSON):
        raise FileNotFoundError(f"{store.uri(layout.CAMPAIGN_JSON)}: not a campaign folder (no campaign.json)")
    manifest = CampaignManifest.read(store)
    if manifest.kind != "campaign":
        raise ValueError(f"{store.uri(layout.CAMPAIGN_JSON)}: a {manifest.kind} folder, not a training campaign")
    # imported here: the config imports the model code (JAX), which `rollstream status` must not load
    from pipelines_lib.config import CampaignConfig

    return CampaignConfig.from_mapping(manifest.config)


def config_problem(config: dict[str, Any]) -> str | None:
    """Why a config snapshot does not load as ``load_campaign_config`` loads it (None: it loads): the audit's
    ``config_check``, so the audit refuses a config every stage would refuse."""
    from pipelines_lib.config import CampaignConfig  # the model code (JAX): only when a config is checked

    try:
        CampaignConfig.from_mapping(config)
    except (ConfigError, ValueError, TypeError) as e:
        return str(e)
    return None


def _numbered(store: Store, folder: str, parse: Callable[[str], int | None], ignored: list[str]) -> list[int]:
    """The numbers of the names under ``folder`` that ``parse`` reads; the other names go to ``ignored``."""
    out = []
    for name in store.list(folder):
        n = parse(name)
        if n is None:
            ignored.append(f"{folder}/{name}")
        else:
            out.append(n)
    return sorted(out)


def claim_heal_attempt(store: Store, *, max_attempts: int, crashed_flow_run_id: str, crashed_flow_run_name: str,
                       healer_flow_run_id: str) -> HealAttempt:
    """Record the next automatic answer to a crash: ``recover`` while fewer than ``max_attempts`` recoveries were
    started, else ``budget spent``. Create-only numbering: two healers racing each get their own attempt."""
    if max_attempts < 0:
        raise ValueError(f"max_attempts must be >= 0, got {max_attempts}")
    attempt = len(records.heal_attempts(store)) + 1
    while True:
        claim = HealAttempt(attempt=attempt, crashed_flow_run_id=crashed_flow_run_id,
                            crashed_flow_run_name=crashed_flow_run_name, healer_flow_run_id=healer_flow_run_id,
                            at=utc_now_iso(), outcome="recover" if attempt <= max_attempts else "budget spent",
                            max_attempts=max_attempts)
        try:
            claim.write(store)
            return claim
        except AlreadyExistsError:
            attempt += 1


def _heal_status(store: Store) -> dict[str, Any]:
    attempts = records.heal_attempts(store)
    spent = [a for a in attempts if a.outcome == "budget spent"]
    return {"recoveries": sum(a.outcome == "recover" for a in attempts),
            "budget_spent_at": spent[0].at if spent else None,
            "last_crashed_run": attempts[-1].crashed_flow_run_name if attempts else None}


def campaign_status(store: Store) -> dict[str, Any]:
    """What each stage has committed (a fork: with its parent's history); ``todo`` lists the stages a recovery
    must run, in order."""
    heal = _heal_status(store)  # this folder's own crashes (a fork does not inherit its parent's budget)
    store = records.with_parents(store)
    versions = records.published_versions(store)
    entries = {store.pointer_entry(layout.WEIGHTS_LATEST, v) for v in versions}
    ignored = [path for n in store.list(f"{layout.WEIGHTS_LATEST}.d")
               if (path := f"{layout.WEIGHTS_LATEST}.d/{n}") not in entries]
    evaluated = _numbered(store, layout.EVAL, layout.parse_eval_name, ignored)
    steps = _numbered(store, layout.CONSUMED, layout.parse_consumed_name, ignored)
    checkpoints = committed_checkpoints(store)
    ignored += [f"{layout.CHECKPOINTS}/{n}" for n in store.list(layout.CHECKPOINTS)
                if layout.checkpoint_step(n) is None]
    manifest = CampaignManifest.read(store) if store.exists(CampaignManifest.PATH) else None
    status = {
        "campaign": manifest is not None,
        "parent": None if manifest is None or manifest.parent is None else {
            "url": manifest.parent.url, "step": manifest.parent.step, "version": manifest.parent.version},
        "dataset": store.exists(DatasetSuccess.PATH),
        "warm_start": 0 in versions,
        "train_done": DoneMarker.exists(store),
        "train_steps": steps[-1] if steps else 0,
        "latest_checkpoint": checkpoints[-1] if checkpoints else None,
        "published_versions": versions,
        "evaluated_versions": evaluated,
        "missing_eval": [v for v in versions if v not in evaluated],
        "shards": sum(len(store.list(f"{layout.TRAJECTORIES}/{d}")) for d in store.list(layout.TRAJECTORIES)),
        "ignored": ignored,
        "heal": heal,
    }
    # What a recovery must run: every stage whose marker record is missing, in table order; init first when
    # there is no campaign.json at all.
    todo = [] if status["campaign"] else ["init"]
    todo += [s.name for s in STAGES if not s.done(store)]
    status["todo"] = todo
    return status


def render_status(status: dict[str, Any], *, recover: str) -> str:
    """``campaign_status`` as a table: one row per stage, done or to do, with what the folder holds; ``recover``
    is the command that runs what is to do (``hints.hint_command``)."""
    versions, evaluated = status["published_versions"], status["evaluated_versions"]
    checkpoint = status["latest_checkpoint"] or "none"
    detail = {
        "prep": f"{'' if status['dataset'] else 'no '}{layout.DATASET_SUCCESS}",
        "warm_start": "v0 published" if status["warm_start"] else "v0 not published",
        "collect": f"{status['shards']} shards",
        "train": f"step {status['train_steps']}, checkpoint {checkpoint}, published {_versions(versions)}",
        "evaluate": f"evaluated {_versions(evaluated)}",
        "audit": "audited after the last stage" if "audit" not in status["todo"] else "",
    }
    todo = status["todo"]
    rows = [("stage", "state", "detail")] + [(s, "to do" if s in todo else "done", d) for s, d in detail.items()]
    if "init" in todo:
        rows.insert(1, ("init", "to do", "no campaign.json"))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}".rstrip() for a, b, c in rows]
    lines.append(f"to do: {', '.join(todo)}; run them with: {recover}" if todo else "to do: nothing")
    heal = status["heal"]
    if heal["budget_spent_at"]:
        lines.append(f"automatic recovery: BUDGET SPENT at {heal['budget_spent_at']} after {heal['recoveries']} "
                     f"recoveries (last crash: {heal['last_crashed_run']}); nothing recovers it but `rollstream recover`")
    elif heal["recoveries"]:
        lines.append(f"automatic recovery: {heal['recoveries']} so far (last crash: {heal['last_crashed_run']})")
    if status["ignored"]:
        lines.append(f"ignored (not names a stage writes): {', '.join(status['ignored'])}")
    return "\n".join(lines)


def _versions(vs: list[int]) -> str:
    return ", ".join(f"v{v}" for v in vs) if vs else "none"
