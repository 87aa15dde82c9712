"""Fork a campaign at one of its steps into a new folder, under changed settings, without copying or touching it.

```
parent: dataset/, trajectories/, train/consumed/, train/checkpoints/, weights/          only read, never copied
   │ fork_campaign(parent, N, new, {"rollout.eta": 0})
   ▼
fork:   campaign.json      the fork's config + parent {url, step N, version V, config_diff}: the fork's only object
```

The fork references its parent's history up to step N. Every stage opens a campaign through
``records.with_parents``, which for a fork reads the parent's dataset, its shards of versions <= V (the groups it
had committed but not trained at step N included), its consumption logs and checkpoints up to N and its
published versions up to V as the fork's own, and writes only into the fork's folder (``storage.forked``). So the
fork's trainer resumes as after a crash: it restores the parent's newest checkpoint at or before N (parameters,
optimiser, RNG, version, tail cursor), replays the parent's logged steps after it, and tails on from the
parent's cursor under the fork's settings. Its rollout workers start from version V; lineage, the audit and the
viewer walk back through the parent's logs and shards. A fork of a fork chains the same way, each level seeing
its parent only up to its own fork point.

Changing the model or the tokenizer would make the parent's checkpoints meaningless, and changing the dataset, the
group size or the sequence buckets would contradict the inherited history: those are refused (``FIXED_KEYS``); η,
the loss, the learning rate and the rest may change. Writing ``campaign.json`` is the whole fork: rerunning the
same fork does nothing, another fork or campaign at the same URL is refused, and so is a URL inside the parent's
folder (or any ancestor's): the fork's writes would land in the history it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import (
    CampaignManifest,
    CheckpointMeta,
    ConsumptionLog,
    ForkParent,
    committed_checkpoints,
    consumption_steps,
    read_folders,
    with_parents,
)
from pipelines_lib.stages.campaign import CampaignMismatchError, code_version, load_campaign_config
from pipelines_lib.storage import layout
from pipelines_lib.storage.destination import refuse_inside
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.schema import SCHEMA_VERSION
from pipelines_lib.utc import utc_now_iso

FIXED_KEYS = {
    "model": "its checkpoint only fits it",
    "tokenizer": "its checkpoint only fits it",
    "dataset": "the fork reads the parent's prepared dataset",
    "rollout.group_size": "the inherited shards hold groups of the parent's size",
    "trainer.seq_buckets": "the inherited groups were checked trainable against the parent's buckets",
}
"""Config keys (a section or one dotted key) a fork may not change, with the reason the error gives."""


def check_fork_overrides(overrides: Mapping[str, Any]) -> None:
    """Refuse a dotted key at or under one of ``FIXED_KEYS``, naming it and why."""
    for key in overrides:
        for fixed, why in FIXED_KEYS.items():
            if key == fixed or key.startswith(fixed + "."):
                raise ValueError(f"--set {key}: a fork keeps its parent's {fixed} ({why}); "
                                 f"change η, the loss, the optimiser or the rollout's pace instead")


def config_diff(parent: Mapping[str, Any], fork: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key → ``{"parent": a, "fork": b}`` for every leaf where the two config mappings differ."""
    out: dict[str, Any] = {}
    for key in sorted(set(parent) | set(fork)):
        a, b = parent.get(key), fork.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.update(config_diff(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = {"parent": a, "fork": b}
    return out


def missing_steps(logged: list[int], start: int, end: int, *, limit: int = 5) -> tuple[list[int], int]:
    """The first ``limit`` steps of ``start+1..end`` not in ``logged`` (ascending), and how many are missing in
    all: arithmetic over the logged steps, never a walk over the range (a step may be any integer)."""
    have = sorted({s for s in logged if start < s <= end})
    first: list[int] = []
    previous = start
    for s in [*have, end + 1]:
        first += range(previous + 1, min(s, previous + 1 + limit - len(first)))
        if len(first) >= limit:
            break
        previous = s
    return first, (end - start) - len(have)


def _version_after(parent: Store, step: int) -> int:
    """The parent's policy version after ``step``. The fork's trainer restores the newest committed checkpoint
    at or before ``step`` (none: the warm start) and replays the logged steps after it, so each must be logged;
    a step past the parent's last logged or checkpointed step is refused with that last step."""
    if step < 1:
        raise ValueError(f"{parent.uri()}: a fork starts after a trained step (>= 1), got step {step}")
    checkpoints = committed_checkpoints(parent)
    logged = consumption_steps(parent)
    last = max([*logged, *(layout.checkpoint_step(f) or 0 for f in checkpoints)], default=0)
    if step > last:
        raise ValueError(f"{parent.uri()}: a fork starts at a step the parent trained, and its last is step {last}; "
                         f"got step {step}")
    folders = [f for f in checkpoints if (layout.checkpoint_step(f) or 0) <= step]
    meta = CheckpointMeta.read(parent, folders[-1]) if folders else None
    if meta is not None and meta.step == step:
        return meta.version
    start = 0 if meta is None else meta.step
    first, count = missing_steps(logged, start, step)
    if count:
        origin = "the warm start" if meta is None else f"the checkpoint of step {start}"
        more = f" and {count - len(first)} more" if count > len(first) else ""
        raise ValueError(f"{parent.uri(layout.CONSUMED)}: a fork at step {step} replays steps {start + 1}..{step} "
                         f"from {origin}, but steps {first}{more} have no consumption log")
    log = ConsumptionLog.read(parent, step)
    return log.trainer_version if log.published_version is None else log.published_version


def fork_campaign(parent: Store, step: int, fork: Store, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Create the fork at ``fork`` from step ``step`` of ``parent`` under ``overrides`` (dotted keys, as
    ``CampaignConfig.with_overrides``); returns ``{"campaign", "parent", "created"}``. Only reads ``parent``."""
    if parent.uri() == fork.uri():
        raise ValueError(f"{fork.uri()}: a fork needs a new campaign URL, not its parent's")
    refuse_inside(fork.url, read_folders(parent), what="the fork's folder")
    check_fork_overrides(overrides)
    parent = with_parents(parent)
    base = load_campaign_config(parent)
    config: CampaignConfig = base.with_overrides(dict(overrides))
    version = _version_after(parent, step)
    origin = ForkParent(url=parent.url, step=step, version=version,
                        config_diff=config_diff(base.to_dict(), config.to_dict()))
    if fork.exists(layout.CAMPAIGN_JSON):
        existing = CampaignManifest.read(fork)
        if existing.parent != origin or CampaignConfig.from_mapping(existing.config) != config:
            raise CampaignMismatchError(f"{fork.uri(layout.CAMPAIGN_JSON)}: already a campaign, not this fork of "
                                        f"{parent.url} at step {step}; use a new URL")
        return {"campaign": fork.url, "parent": origin.to_dict(), "created": False}
    CampaignManifest(schema_version=SCHEMA_VERSION, code_version=code_version(), created_at=utc_now_iso(),
                     config=config.to_dict(), parent=origin).write(fork)
    return {"campaign": fork.url, "parent": origin.to_dict(), "created": True}


__all__ = ["FIXED_KEYS", "check_fork_overrides", "config_diff", "fork_campaign", "missing_steps"]
