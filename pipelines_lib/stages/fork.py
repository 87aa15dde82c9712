"""Fork a campaign from one of its checkpoints into a new folder, under changed settings, without touching it.

```
parent: campaign.json, dataset/, weights/v0, weights/v<V>, train/checkpoints/<N>/      (only read)
   │ fork_campaign(parent, N, new, {"rollout.eta": 0})
   ▼
fork:   dataset/<split>.arrow … then dataset/_SUCCESS                            copies, marker last
        weights/v00000000/, weights/v<V>/ … PUBLISHED.json last, LATEST → v<V>   copies, pointer moved last
        train/checkpoints/<N>/state, meta.json (a fresh cursor), COMMITTED       the parent's state after step N
        campaign.json                                                            the fork's config + ``parent``
```

The fork copies what its stages read (the dataset, version 0 for the trainer's model shape and
reference, version V for the rollout workers, the checkpoint for the trainer); it never references the
parent's objects, so a fork keeps working when its parent moves or is deleted, and nothing written into the fork
can reach the parent. Step N needs a committed checkpoint at or before it: one of step K < N is restored and the parent's
logged steps K+1..N re-trained in memory from the rows their logs name (as a replay does), then saved as the
fork's checkpoint N. Its trainer restores checkpoint N (parameters, optimiser, RNG, step N, version V) and
tails the fork's own shards from an empty cursor; its workers start from version V. ``campaign.json`` is written
last: a folder without it is an unfinished fork, and a rerun of the same fork completes it (every copy is
create-only and skips objects already there) or, once complete, does nothing.

Changing the model or the tokenizer would make the checkpoint meaningless and is refused; η, the loss, the
learning rate and everything else may change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import (
    CampaignManifest,
    CheckpointMeta,
    ConsumptionLog,
    DatasetSuccess,
    ForkParent,
    Publication,
)
from pipelines_lib.stages.campaign import CampaignMismatchError, code_version, load_campaign_config
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.storage.tailer import TailCursor
from pipelines_lib.train.checkpoint import committed_checkpoints, save_checkpoint
from pipelines_lib.train.replay import retrain_to
from pipelines_lib.train.trainer import StreamingTrainer
from pipelines_lib.trajectory.record import utc_now_iso
from pipelines_lib.trajectory.schema import SCHEMA_VERSION

FIXED_KEYS = ("model", "tokenizer")
"""Config sections a fork may not change (the checkpoint's parameters only fit the parent's model and tokens)."""


def check_fork_overrides(overrides: Mapping[str, Any]) -> None:
    """Refuse a dotted key under ``FIXED_KEYS``, naming it."""
    for key in overrides:
        section = key.split(".", 1)[0]
        if section in FIXED_KEYS:
            raise ValueError(f"--set {key}: a fork keeps its parent's {section} (its checkpoint only fits it); "
                             f"change η, the loss, the optimiser or the rollout instead")


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


def _checkpoint_for(parent: Store, step: int) -> str:
    """The newest committed checkpoint at or before ``step``; a ``ValueError`` naming the checkpointed steps."""
    folders = committed_checkpoints(parent)
    usable = [f for f in folders if (layout.checkpoint_step(f) or 0) <= step]
    if not usable:
        have = ", ".join(str(layout.checkpoint_step(f)) for f in folders) or "none"
        raise ValueError(f"{parent.uri(layout.CHECKPOINTS)}: step {step} has no committed checkpoint at or before "
                         f"it to fork from (steps with one: {have})")
    return usable[-1]


def _version_after(parent: Store, meta: CheckpointMeta, step: int) -> int:
    """The parent's policy version after ``step``, from its log; every step after the checkpoint must be logged."""
    if meta.step == step:
        return meta.version
    missing = [s for s in range(meta.step + 1, step + 1) if not ConsumptionLog.exists(parent, s)]
    if missing:
        raise ValueError(f"{parent.uri(layout.CONSUMED)}: forking at step {step} re-trains steps "
                         f"{meta.step + 1}..{step} from the checkpoint of step {meta.step}, but steps {missing} "
                         "have no consumption log")
    log = ConsumptionLog.read(parent, step)
    return log.trainer_version if log.published_version is None else log.published_version


def _seed_checkpoint(parent: Store, base: CampaignConfig, folder: str, meta: CheckpointMeta, step: int,
                     version: int, fork: Store) -> None:
    """The fork's committed checkpoint of ``step``: the parent's state then, with an empty cursor (the fork
    trains on its own shards only). A parent checkpoint of that very step is copied; from an earlier one the
    logged steps in between are re-trained in memory (``train.replay.retrain_to``, reading the parent only)."""
    target = layout.checkpoint_dir(step)
    if fork.exists(layout.checkpoint_committed(target)):
        return
    cursor = TailCursor().to_json()
    if meta.step != step:
        trainer = StreamingTrainer(parent, base.trainer, eta=base.rollout.eta, group_size=base.rollout.group_size,
                                   log=lambda _: None)
        retrain_to(trainer, step)
        save_checkpoint(fork, step=step, version=version, cursor=cursor,
                        rng=jax.random.wrap_key_data(np.asarray(meta.rng, np.uint32)), model=trainer.model,
                        optimizer=trainer.optimizer)
        return
    _copy_folder(parent, fork, f"{folder}/state", f"{target}/state")
    if not fork.exists(layout.checkpoint_meta(target)):
        CheckpointMeta(step=step, version=version, cursor=cursor, rng=meta.rng).write(fork, target)
    fork.create(layout.checkpoint_committed(target), b"")


def _copy(parent: Store, fork: Store, src: str, dst: str | None = None) -> None:
    """Copy one object, create-only; one already in the fork is complete (create-only writers) and kept."""
    dst = dst or src
    if not fork.exists(dst):
        fork.create(dst, parent.read(src))


def _copy_folder(parent: Store, fork: Store, src: str, dst: str, *, last: tuple[str, ...] = ()) -> None:
    """Every object under ``src`` into ``dst``; the names in ``last`` (markers) after all the others."""
    names = [p[len(src) + 1:] for p in parent.walk(src)]
    for name in sorted(names, key=lambda n: (n in last, n)):
        _copy(parent, fork, f"{src}/{name}", f"{dst}/{name}")


def _copy_version(parent: Store, fork: Store, version: int) -> None:
    folder = layout.weights_dir(version)
    _copy_folder(parent, fork, folder, folder, last=(layout.PUBLISHED,))
    Publication.read(fork, version).advance(fork)


def fork_campaign(parent: Store, step: int, fork: Store, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Create the fork at ``fork`` from checkpoint ``step`` of ``parent`` under ``overrides`` (dotted keys, as
    ``CampaignConfig.with_overrides``); returns ``{"campaign", "parent", "created"}``. Only reads ``parent``."""
    if parent.uri() == fork.uri():
        raise ValueError(f"{fork.uri()}: a fork needs a new campaign URL, not its parent's")
    check_fork_overrides(overrides)
    base = load_campaign_config(parent)
    config: CampaignConfig = base.with_overrides(dict(overrides))
    folder = _checkpoint_for(parent, step)
    meta = CheckpointMeta.read(parent, folder)
    version = _version_after(parent, meta, step)
    origin = ForkParent(url=parent.url, step=step, version=version,
                        config_diff=config_diff(base.to_dict(), config.to_dict()))
    if fork.exists(layout.CAMPAIGN_JSON):
        existing = CampaignManifest.read(fork)
        if existing.parent != origin or CampaignConfig.from_mapping(existing.config) != config:
            raise CampaignMismatchError(f"{fork.uri(layout.CAMPAIGN_JSON)}: already a campaign, not this fork of "
                                        f"{parent.url} at step {step}; use a new URL")
        return {"campaign": fork.url, "parent": origin.to_dict(), "created": False}

    if parent.exists(DatasetSuccess.PATH):
        for split in DatasetSuccess.read(parent).splits.values():
            _copy(parent, fork, split.path)
        _copy(parent, fork, DatasetSuccess.PATH)
    for v in sorted({0, version}):
        _copy_version(parent, fork, v)
    _seed_checkpoint(parent, base, folder, meta, step, version, fork)
    CampaignManifest(schema_version=SCHEMA_VERSION, code_version=code_version(), created_at=utc_now_iso(),
                     config=config.to_dict(), parent=origin).write(fork)
    return {"campaign": fork.url, "parent": origin.to_dict(), "created": True}


__all__ = ["FIXED_KEYS", "check_fork_overrides", "config_diff", "fork_campaign"]
