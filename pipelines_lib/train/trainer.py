"""The streaming GRPO trainer: tail shards, train on whole groups, publish, checkpoint, resume exactly.

```
 restore newest committed checkpoint (or load published v0)
 replay steps whose consumption logs outlived the checkpoint (the logs are a write-ahead log)
 loop:
   groups  ← tailer.next_groups(window [V−η, V])         waits (idle time) when data is short
   batch   ← whole groups, advantages per group, bucketed padding
   train_step(model, optimizer, batch)                    one function, GRPO loss from the registry
   train/consumed/<step>.json                             groups (shard, rows, version, staleness),
                                                          drops, skips, and the tail cursor after the step
   every P steps: publish weights/v<V+1> (pointer moved last)
   every K steps and at every publish: checkpoint (params, optimizer, RNG, step, version, cursor)
 train/DONE.json                                          marker last
```

Exact resume: a step's consumption log is written before its effects (publication, checkpoint) and
carries the cursor after the step. After a crash the trainer restores checkpoint K, re-trains steps
K+1..N from the groups their logs name (same shards, same rows, same order: bit-identical on a
deterministic backend), takes the cursor of log N, and continues. So no group is trained twice in the
surviving history, none committed before the crash is skipped, and every published version is one the
resumed run reproduces. Versions are published only at checkpoints, so a version never runs ahead of the
state it came from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pyarrow as pa

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.model.decoder import with_dtype
from pipelines_lib.publish import load_published, publish_weights
from pipelines_lib.rollout.episodes import campaign_tokenizer_dir
from pipelines_lib.storage import layout
from pipelines_lib.storage.shards import read_shard
from pipelines_lib.storage.store import Store
from pipelines_lib.storage.tailer import GroupSlice, ShardTailer, TailCursor
from pipelines_lib.train.advantages import compute_advantages
from pipelines_lib.train.batch import build_train_batch
from pipelines_lib.train.checkpoint import restore_latest, save_checkpoint
from pipelines_lib.train.optim import make_nnx_optimizer
from pipelines_lib.train.step import train_step
from pipelines_lib.trajectory.record import utc_now_iso


class DataTimeoutError(TimeoutError):
    """The trainer waited longer than ``data_timeout_s`` for enough groups."""


def _rows(table: pa.Table) -> dict[str, list]:
    return {
        c: table.column(c).to_pylist() for c in ("tokens", "loss_mask", "logprobs", "reward", "sample_idx")
    }


def batch_from_groups(groups: list[GroupSlice], config: CampaignConfig, pad_id: int):
    """Whole groups → (TrainBatch, per-group advantages, degenerate mask, token count)."""
    g_size = config.rollout.group_size
    tokens, masks, logps, rewards = [], [], [], []
    for g in groups:
        rows = _rows(g.table)
        order = np.argsort(rows["sample_idx"])
        if len(order) != g_size:
            raise ValueError(
                f"{g.shard} rows [{g.row_start}, {g.row_end}): group {g.group_id} has "
                f"{len(order)} samples, the campaign's group_size is {g_size}"
            )
        for i in order:
            tokens.append(rows["tokens"][i])
            masks.append(rows["loss_mask"][i])
            logps.append(rows["logprobs"][i])
        rewards.append([rows["reward"][i] for i in order])
    adv_gk, degenerate_g = compute_advantages(
        np.asarray(rewards, np.float32), estimator=config.trainer.advantage
    )
    batch = build_train_batch(
        tokens,
        masks,
        logps,
        np.asarray(adv_gk).reshape(-1).tolist(),
        seq_buckets=config.trainer.seq_buckets,
        batch_size=config.trainer.batch_groups * g_size,
        pad_id=pad_id,
    )
    return batch, np.asarray(degenerate_g), int(sum(sum(m) for m in masks))


class StreamingTrainer:
    """State of one trainer process; ``run`` drives it. Storage, clock and sleep are injected."""

    def __init__(
        self,
        store: Store,
        config: CampaignConfig,
        *,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.config = config
        self.tc = config.trainer
        self.eta = config.rollout.eta
        self.log = log
        self.clock = clock
        self.sleep = sleep
        model, base_version = load_published(store, 0)
        if base_version != 0:
            raise RuntimeError(f"{store.uri()}: expected the warm start as version 0, found {base_version}")
        self.precision = self.tc.step.precision
        self.model = with_dtype(model, self.precision.params)  # the master weights
        self.optimizer = make_nnx_optimizer(self.model, self.tc.optim)
        self.rng = jax.random.key(self.tc.seed)
        self.step = 0
        self.version = 0
        self.tailer = ShardTailer(store)
        self.metrics: list[dict[str, Any]] = []
        self.idle_s = 0.0
        self._last_wait_log = -1e9
        self.busy_s = 0.0
        self.tokens_trained = 0
        self.pad_id = 0

    # -- resume ------------------------------------------------------------------------------------------
    def restore(self) -> None:
        meta = restore_latest(self.store, model=self.model, optimizer=self.optimizer)
        if meta is not None:
            self.step, self.version = meta.step, meta.version
            self.tailer = ShardTailer(self.store, cursor=TailCursor.from_json(meta.cursor))
            self.rng = jax.random.wrap_key_data(np.asarray(meta.rng, np.uint32))
            self.log(f"trainer: restored checkpoint {meta.folder} (step {meta.step}, version {meta.version})")
        replayed = 0
        while self.store.exists(layout.consumed_log(self.step + 1)):
            entry = self.store.read_json(layout.consumed_log(self.step + 1))
            groups = [self.reload_group(g) for g in entry["groups"]]
            self._train_on(groups, replay=entry)
            self.tailer = ShardTailer(self.store, cursor=TailCursor.from_json(entry["cursor_after"]))
            replayed += 1
        if replayed:
            self.log(
                f"trainer: replayed {replayed} logged step(s) after the checkpoint; now at step {self.step}"
            )

    def reload_group(self, g: dict[str, Any]) -> GroupSlice:
        """The group a consumption-log entry names, read back from its shard (replay and benchmarks)."""
        table, _ = read_shard(self.store, g["shard"])
        part = table.slice(g["row_start"], g["row_end"] - g["row_start"])
        return GroupSlice(
            shard=g["shard"],
            version=g["version"],
            row_start=g["row_start"],
            row_end=g["row_end"],
            group_id=g["group_id"],
            table=part,
        )

    # -- data --------------------------------------------------------------------------------------------
    def _gather(self) -> tuple[list[GroupSlice], list[dict], list[dict]]:
        """``batch_groups`` useful groups from the window; waits while short (idle time)."""
        groups: list[GroupSlice] = []
        zero_adv: list[dict] = []
        events: list[dict] = []
        waited_since = None
        while len(groups) < self.tc.batch_groups:
            lo = max(0, self.version - self.eta)
            got = self.tailer.next_groups(
                self.tc.batch_groups - len(groups), min_version=lo, max_version=self.version
            )
            for e in self.tailer.drain_events():
                events.append(
                    {"kind": e.kind, "shard": e.shard, "reason": e.reason, "groups": list(e.groups)}
                )
            for g in got:
                rewards = g.table.column("reward").to_pylist()
                if self.tc.skip_zero_advantage and len(set(rewards)) == 1:
                    zero_adv.append({"group_id": g.group_id, "shard": g.shard, "reward": rewards[0]})
                else:
                    groups.append(g)
            if got:
                waited_since = None
                continue
            now = self.clock()
            if waited_since is None:
                waited_since = now
                if zero_adv and now - self._last_wait_log >= 10.0:
                    self._last_wait_log = now
                    # Say why a step takes long: all-equal groups carry no gradient and are not trained on.
                    self.log(f"trainer: step {self.step + 1} has {len(groups)} of {self.tc.batch_groups} groups; "
                             f"{len(zero_adv)} groups skipped so far had all-equal rewards "
                             f"(mean {np.mean([z['reward'] for z in zero_adv]):.2f}); waiting for more")
            elif now - waited_since > self.tc.data_timeout_s:
                raise DataTimeoutError(
                    f"trainer step {self.step + 1}: waited {now - waited_since:.1f}s for groups in "
                    f"{self.store.uri(layout.TRAJECTORIES)}/v{lo:08d}..v{self.version:08d}; have {len(groups)} of "
                    f"{self.tc.batch_groups} (are rollout workers running and on weights >= v{lo}?)"
                )
            t0 = self.clock()
            with telemetry.span("data_wait", track="trainer", step=self.step + 1, have=len(groups)):
                self.sleep(self.tc.poll_s)
            self.idle_s += self.clock() - t0
        return groups, zero_adv, events

    # -- one step ----------------------------------------------------------------------------------------
    def _train_on(
        self,
        groups: list[GroupSlice],
        *,
        replay: dict | None = None,
        zero_adv: list | None = None,
        events: list | None = None,
    ) -> dict[str, Any]:
        t0 = self.clock()
        with telemetry.span("train_step", track="trainer", step=self.step + 1, groups=len(groups)):
            batch, degenerate, n_tokens = batch_from_groups(groups, self.config, self.pad_id)
            metrics = train_step(self.model, self.optimizer, batch, cfg=self.tc.step)
            metrics = {k: float(v) for k, v in metrics.items()}
        self.step += 1
        self.tokens_trained += n_tokens
        publish = self.step % self.tc.publish_every == 0 or self.step == self.tc.max_steps
        record = {
            "step": self.step,
            "trainer_version": self.version,
            "created_at": utc_now_iso(),
            "groups": [
                {
                    "group_id": g.group_id,
                    "shard": g.shard,
                    "row_start": g.row_start,
                    "row_end": g.row_end,
                    "version": g.version,
                    "staleness": self.version - g.version,
                }
                for g in groups
            ],
            "skipped_zero_advantage": zero_adv or [],
            "dropped_stale": [e for e in events or [] if e["kind"] == "dropped_stale"],
            "skipped": [e for e in events or [] if e["kind"] == "skipped"],
            "published_version": self.version + 1 if publish else None,
            "cursor_after": self.tailer.cursor.to_json(),
            "metrics": metrics,
            "mean_reward": float(np.mean([r for g in groups for r in g.table.column("reward").to_pylist()])),
        }
        if replay is None:
            self.store.create_json(layout.consumed_log(self.step), record)  # the write-ahead record
        else:
            record = replay
        if publish:
            self.version += 1
            with telemetry.span("publish", track="trainer", step=self.step, version=self.version):
                # Engines serve the compute-dtype copy; the master weights stay in the checkpoint.
                publish_weights(self.store, with_dtype(self.model, self.precision.compute), version=self.version,
                                step=self.step, tokenizer_dir=campaign_tokenizer_dir(self.config))
        if publish or self.step % self.tc.checkpoint_every == 0:
            with telemetry.span("checkpoint", track="trainer", step=self.step):
                save_checkpoint(
                    self.store,
                    step=self.step,
                    version=self.version,
                    cursor=record["cursor_after"],
                    rng=self.rng,
                    model=self.model,
                    optimizer=self.optimizer,
                )
        for name, value in metrics.items():  # loss, gradient and behaviour–proximal mismatch figures per step
            telemetry.gauge(f"train.{name}", value, step=self.step)
        telemetry.gauge("trainer_version", self.version)
        telemetry.gauge("dropped_stale_groups", self.tailer.cursor.groups_dropped_stale)
        for g in record["groups"]:
            telemetry.count(f"staleness.{g['staleness']}")
        self.busy_s += self.clock() - t0
        self.metrics.append(
            {
                "step": self.step,
                **metrics,
                "mean_reward": record["mean_reward"],
                "staleness_max": max((g["staleness"] for g in record["groups"]), default=0),
            }
        )
        return record

    def run(self, max_steps: int | None = None) -> dict[str, Any]:
        target = min(max_steps or self.tc.max_steps, self.tc.max_steps)
        t_start = self.clock()
        while self.step < target:
            groups, zero_adv, events = self._gather()
            record = self._train_on(groups, zero_adv=zero_adv, events=events)
            m = record["metrics"]
            self.log(
                f"trainer: step {self.step}/{self.tc.max_steps} v{self.version} loss {m['loss']:+.4f} "
                f"reward {record['mean_reward']:.3f} staleness<= "
                f"{max((g['staleness'] for g in record['groups']), default=0)} "
                f"dropped {self.tailer.cursor.groups_dropped_stale} idle {self.idle_s:.1f}s"
            )
        wall = self.clock() - t_start
        summary = {
            "steps": self.step,
            "version": self.version,
            "groups_consumed": self.tailer.cursor.groups_consumed,
            "groups_dropped_stale": self.tailer.cursor.groups_dropped_stale,
            "shards_skipped": self.tailer.cursor.shards_skipped,
            "idle_s": round(self.idle_s, 3),
            "busy_s": round(self.busy_s, 3),
            "wall_s": round(wall, 3),
            "tokens_trained": self.tokens_trained,
        }
        if self.step >= self.tc.max_steps and not self.store.exists(layout.TRAIN_DONE):
            self.store.create_json(layout.TRAIN_DONE, {**summary, "finished_at": utc_now_iso()})
        return summary


def train(
    store: Store, config: CampaignConfig, *, max_steps: int | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The train stage (docs/STAGES.md): resume, train to ``max_steps`` (default: config), mark done."""
    if store.exists(layout.TRAIN_DONE):
        return store.read_json(layout.TRAIN_DONE)
    with telemetry.recording(store, "trainer"):
        trainer = StreamingTrainer(store, config, log=log)
        trainer.restore()
        return trainer.run(max_steps)


__all__ = ["DataTimeoutError", "StreamingTrainer", "train"]
