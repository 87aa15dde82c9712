"""What the drills and the tests both build: a small trainer campaign, its final parameters, and records.

```
small_trainer_config(max_steps, eta=...)   a 1-layer model, batches of 2 groups: steps of a few hundred ms on CPU
seed_trainer_campaign(url, config, n)      campaign.json, a random-init v0 and n synthetic groups in shards of 3
                                           (in the folder, or in the channel given)
final_params(store)                        the published parameters of the finished run, as one JSON string
consumed_group_ids(store)                  the groups of every consumption log, in step order
consumption_log / done_marker / ...        whole records with the fields a test does not care about filled in
trained_campaign(store, config)            the records of a campaign trained up to evaluation (v0..v2, DONE)
```
The kill drills compare a killed run with a reference through ``final_params`` and ``consumed_group_ids``; the
trainer tests pin the same contract in-process.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import (
    ConsumedGroup,
    ConsumptionLog,
    DatasetSuccess,
    DoneMarker,
    EvalResult,
    Publication,
    RunRecord,
    consumption_logs,
)
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import Channel


def small_trainer_config(max_steps: int, *, eta: int = 10_000, **trainer: Any) -> CampaignConfig:
    """A 1-layer model and small batches: steps of a few hundred milliseconds on CPU."""
    from pipelines_lib.model.config import ModelConfig

    base = CampaignConfig.tiny()
    model = dataclasses.replace(ModelConfig.tiny(), n_layers=1, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32,
                                d_ff=128)
    return dataclasses.replace(base, model=model, rollout=dataclasses.replace(base.rollout, eta=eta),
                               trainer=dataclasses.replace(base.trainer, **{
                                   "batch_groups": 2, "max_steps": max_steps, "publish_every": 2,
                                   "checkpoint_every": 3, "skip_zero_advantage": False, "poll_s": 0.05,
                                   "data_timeout_s": 30, **trainer}))


def seed_trainer_campaign(url: str, config: CampaignConfig, n_groups: int, *, channel: Channel | None = None) -> Store:
    """init, a random-init v0, and ``n_groups`` synthetic groups in shards of 3, committed to ``channel`` (default:
    the campaign folder's)."""
    from flax import nnx

    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.stages.campaign import init_campaign
    from pipelines_lib.trajectory.channel import WriterConfig
    from pipelines_lib.trajectory.folder import FolderChannel
    from pipelines_lib.trajectory.synthetic import synthetic_group

    store = Store(url)
    init_campaign(store, config)
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)), version=0, step=0)
    writer = (channel or FolderChannel(store)).writer("w0", WriterConfig(max_groups=3))
    for i in range(n_groups):
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=4, worker_id="w0", policy_version=0,
                                         seed=i, vocab_size=config.model.vocab_size, max_len=60))
    writer.flush()
    return store


def final_params(store: Store) -> str:
    """Parameters of the version the finished trainer published last, as JSON (equal strings: bit-identical)."""
    import jax
    import numpy as np
    from flax import nnx

    from pipelines_lib.model.weights import load_weights

    model = load_weights(store.uri(layout.weights_dir(DoneMarker.read(store).version)))
    return json.dumps([np.asarray(x).tolist() for x in jax.tree.leaves(nnx.state(model, nnx.Param))])


def consumed_group_ids(store: Store) -> list[str]:
    return [g.group_id for log in consumption_logs(store) for g in log.groups]


def consumption_log(step: int, *, staleness: tuple[int, ...] = (), **fields: Any) -> ConsumptionLog:
    """A step's log; one group per entry of ``staleness``, with that staleness."""
    groups = [ConsumedGroup(group_id=f"g{step}.{i}", shard="s", row_start=i, row_end=i + 1, version=0, staleness=s)
              for i, s in enumerate(staleness)]
    return ConsumptionLog(**{"step": step, "trainer_version": max(staleness, default=0), "groups": groups,
                             "created_at": "2026-01-01T00:00:00+00:00", **fields})


def done_marker(**fields: Any) -> DoneMarker:
    return DoneMarker(**{"steps": 1, "version": 1, "groups_consumed": 1, "groups_dropped_stale": 0,
                         "shards_skipped": 0, "idle_s": 0.0, "busy_s": 1.0, "wall_s": 1.0, "tokens_trained": 1,
                         "finished_at": "2026-01-01T00:00:00+00:00", **fields})


def eval_result(version: int, **fields: Any) -> EvalResult:
    return EvalResult(**{"version": version, "split": "heldout", "temperature": 1.0, "tasks": 1, "k": 0,
                         "greedy": {}, "greedy_success_rate": 0.0, "pass_at_k": None, "wall_s": 1.0,
                         "generated_tokens": 1, **fields})


def trained_campaign(store: Store, config: CampaignConfig, *, done: bool = True) -> None:
    """``campaign.json``, the dataset marker and versions 0, 1, 2 published (the pointer moved to each), then the
    trainer's done marker unless ``done`` is False: a campaign whose next stage is evaluation."""
    init_campaign(store, config)
    DatasetSuccess(source="tiny", seed=0, splits={}, bad_rows=[]).write(store)
    for v in (0, 1, 2):
        publication = Publication(version=v, path=layout.weights_dir(v), step=2 * v, published_at="t")
        publication.write(store)
        publication.advance(store)
    if done:
        done_marker().write(store)


def run_record(key: str, flow_run_id: str, **fields: Any) -> RunRecord:
    return RunRecord(**{"key": key, "flow_run_id": flow_run_id, "flow_run_name": "run", "deployment_id": None,
                        "task_run_id": None, "host": "h", "pid": 1, "started_at": "2026-01-01T00:00:00+00:00",
                        "state": "completed", "finished_at": "2026-01-01T00:00:01+00:00", "seconds": 1.0, **fields})


__all__ = ["consumed_group_ids", "consumption_log", "done_marker", "eval_result", "final_params", "run_record",
           "seed_trainer_campaign", "small_trainer_config", "trained_campaign"]
