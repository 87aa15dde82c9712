"""Replay a campaign's training step from its folder alone (``train.replay``), under its own config or a what-if.

``replay(store, step)`` reads ``campaign.json`` for the trainer's section, rebuilds the trainer that ran
(version 0's weights), and recomputes ``step`` from the checkpoint and rows the campaign holds. Nothing is
written into the campaign; ``dump`` (another store: a local folder or ``gs://``) receives the batch as
``step-<N>.parquet`` (``step-<N>-what-if.parquet`` under a what-if), create-only like every output, and never
inside the campaign folder (or a fork parent's) it reads.

A what-if changes the loss of that one step: only keys under ``WHAT_IF_KEYS`` (the loss, its clip range and
correction cap, the aggregation, the advantage estimator) may differ; anything else would not be the same step.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow.parquet as pq

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import read_folders
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.storage.destination import refuse_inside
from pipelines_lib.storage.store import Store
from pipelines_lib.train.replay import COMPARED, StepReplay, replay_step
from pipelines_lib.train.trainer import StreamingTrainer

WHAT_IF_KEYS = ("trainer.advantage", "trainer.step.loss.")
"""Dotted config keys (exact, or a prefix ending in ``.``) a what-if may set."""


def what_if_config(config: CampaignConfig, what_if: Mapping[str, Any]) -> CampaignConfig:
    """``config`` with the what-if's settings, validated; a key outside ``WHAT_IF_KEYS`` is a ``ValueError``
    listing them."""
    for key in what_if:
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in WHAT_IF_KEYS):
            raise ValueError(f"--what-if {key}: only the step's loss settings can change; keys: "
                             f"{', '.join(k + '*' if k.endswith('.') else k for k in WHAT_IF_KEYS)}")
    return config.with_overrides(dict(what_if))


def dump_name(step: int, *, what_if: bool) -> str:
    return f"step-{step:08d}{'-what-if' if what_if else ''}.parquet"


def replay(store: Store, step: int, *, what_if: Mapping[str, Any] | None = None, dump: Store | None = None,
           log: Callable[[str], None] = print) -> dict[str, Any]:
    """Recompute ``step``; returns loss and gradient norm (logged and recomputed), ``identical``, the step's
    other metrics, the per-group contributions, and where the dump went. A ``dump`` inside a campaign the
    replay reads is refused before anything runs."""
    if dump is not None:
        refuse_inside(dump.url, read_folders(store), what="--dump")
    config = load_campaign_config(store)
    changed = what_if_config(config, what_if) if what_if else config
    trainer = StreamingTrainer(store, config.trainer, eta=config.rollout.eta, group_size=config.rollout.group_size,
                               log=log)
    result = replay_step(trainer, step, what_if=changed.trainer if what_if else None)
    dumped = None
    if dump is not None:
        name = dump_name(step, what_if=bool(what_if))
        sink = io.BytesIO()
        pq.write_table(result.rows, sink)
        dump.create(name, sink.getvalue())
        dumped = dump.uri(name)
    return _summary(result, what_if=dict(what_if or {}), dump=dumped)


def _summary(result: StepReplay, *, what_if: dict[str, Any], dump: str | None) -> dict[str, Any]:
    return {
        "step": result.step,
        "identical": result.identical,
        "what_if": what_if,
        "from_checkpoint": result.from_checkpoint,
        "replayed_steps": result.replayed_steps,
        **{k: {"logged": result.logged.get(k), "recomputed": result.metrics[k]} for k in COMPARED},
        "metrics": result.metrics,
        "groups": [{"group_id": g.group_id, "shard": g.shard, "rows": [g.row_start, g.row_end], "rewards": g.rewards,
                    "advantages": g.advantages, "loss": g.loss} for g in result.groups],
        "dump": dump,
    }


__all__ = ["WHAT_IF_KEYS", "dump_name", "replay", "what_if_config"]
