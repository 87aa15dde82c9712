"""The streaming GRPO trainer: tail shards, train on whole groups, publish, checkpoint, resume exactly.

```
 restore newest committed checkpoint (or load published v0)
 replay steps whose consumption logs outlived the checkpoint (the logs are a write-ahead log)
 loop:
   groups  ← tailer.next_groups(window [V−η, V])         waits (idle time) when data is short
   batch   ← whole groups, advantages per group, bucketed padding
   train_step(model, optimizer, batch)                    one function, GRPO loss from the registry
   train/consumed/<step>.json                             groups (shard, rows, version, staleness),
                                                          drops, skips (with reasons), and the tail cursor's delta
   every P steps: publish weights/v<V+1> (pointer moved last)
   every K steps and at the last: checkpoint (params, optimizer, RNG, step, version, cursor)
 train/DONE.json                                          marker last, once the writes (off the loop: train.writer) end
```

Exact resume: a step's consumption log is written before its effects (publication, checkpoint) and
carries what the step changed in the tail cursor (checkpoints hold it whole) and a digest of each group's rows.
After a crash the trainer restores checkpoint K, re-trains steps K+1..N from the groups their logs name (same
shards, same rows, same order: bit-identical on a deterministic backend; ``reload`` refuses rows whose digest or
trainability changed since, naming the step and shard), applies their cursor deltas to the checkpoint's cursor,
and continues. So no group is trained twice in the surviving history, none committed before the crash is
skipped, and every published version is one the resumed run reproduces: a version published after checkpoint K
is re-trained from its steps' logs (its stored weights and pointer are kept, the publication a no-op), exactly on
the same deterministic backend; resumed on other devices, the trainer's state may differ from the stored version by
rounding, which the samples' recorded log-probabilities and the staleness correction absorb. Checkpoints are not
tied to publications because a checkpoint is the larger write (float32 masters and moments). A fork
(``records.with_parents``) starts the same way from its parent's checkpoint and logs up to the fork step, read through
the fork's view of its parent; a replayed step publishes exactly when its log says it did, whatever the fork's own
``publish_every``.

Data the trainer cannot train on never reaches a step: the tailer is given the trainer's needs (group size,
longest row, vocabulary; ``TrainerNeeds.of``) and skips anything else with a reason that lands in the step's
consumption log (``skipped``). A bad shard therefore costs one log line, not a crash that every restart would repeat.
A step whose loss or gradient norm is not finite is never logged, published or checkpointed: the trainer stops
with a ``NonFiniteStepError`` naming the step.

Devices and processes: the trainer builds its mesh from ``TrainerConfig.mesh`` (``pipelines_lib.mesh``), loads v0 onto
it and feeds each step's rows over its ``data`` × ``fsdp`` axes. Spanning several processes (one per host,
``distributed``), every process runs this same loop over the same shards: before each step they check that they
agree on its groups and cursor (``distributed.agree``; a mismatch is an error, never a silent divergence), every
process saves and restores its own checkpoint shards, and process 0 alone writes consumption logs, DONE,
checkpoint markers, publications and the pointer.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pipelines_lib import telemetry
from pipelines_lib.distributed import agree, any_process, is_writer
from pipelines_lib.heap import trim_heap_after_compiles
from pipelines_lib.mesh import describe_mesh, make_mesh, shard_batch, shard_node
from pipelines_lib.model.decoder import Decoder, with_dtype
from pipelines_lib.publish import load_published
from pipelines_lib.records import ConsumptionLog, DoneMarker, ZeroAdvantageGroup, with_parents
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.train.batch import batch_from_groups
from pipelines_lib.train.checkpoint import checkpoint_state, restore_latest
from pipelines_lib.train.config import TrainerConfig
from pipelines_lib.train.optim import make_nnx_optimizer
from pipelines_lib.train.reload import reload_step, undigested
from pipelines_lib.train.step import train_step
from pipelines_lib.train.writer import TrainerWrites
from pipelines_lib.trajectory.channel import Channel, GroupSlice, GroupSource, no_learning_signal
from pipelines_lib.trajectory.cursor import TailCursor, TailEvent
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.needs import TrainerNeeds
from pipelines_lib.trajectory.trainable import INFRA_REASON
from pipelines_lib.trajectory.window import Window, zero_advantage, zero_advantage_summary
from pipelines_lib.utc import utc_now_iso


class DataTimeoutError(TimeoutError):
    """The trainer waited longer than ``data_timeout_s`` for enough groups. ``progress``: what it had done by then,
    as a done marker (not written: it did not finish), for a caller that records a stalled run (a benchmark's arm)."""

    progress: DoneMarker | None = None


class NonFiniteStepError(FloatingPointError):
    """A step's loss or gradient norm was not finite: nothing of it was logged, published or checkpointed."""


class StreamingTrainer:
    """State of one trainer process; ``run`` drives it. Storage, clock and sleep are injected.

    ``eta`` (the campaign's ``rollout.eta``) bounds the staleness of what it trains on; ``group_size`` (the campaign's
    ``rollout.group_size``) is checked against every group it reads; publications carry the tokenizer files of
    ``tokenizer_dir`` in their HF folder. ``on_publish(version, model)`` is called just before each publication with the
    compute-dtype model about to be published, for an engine in the same process (colocated placement), which may serve
    it before ``weights/LATEST`` names the version (``rollout.swap_at_hand_over``); the trainer waits for a version's
    write before it hands over the next; the next step may donate that model's buffers, so the callee copies what it
    keeps; ``on_published(version)`` once the pointer names it (from the thread that wrote it), so that such an
    engine's workers need not wait for their next look at the pointer. ``abort()`` is asked at every wait for groups; an
    exception it returns is raised (colocated placement: the process's rollout workers failed, so no group will come).
    ``should_stop()`` is asked before each step and at every wait for groups; once it says so, ``run`` drops the groups
    of the unfinished step, checkpoints the steps trained since the last checkpoint and returns without the done marker.
    ``channel`` is where groups come from, and a replayed step's groups are read again (default: the campaign folder's
    shards)."""

    def __init__(
        self,
        store: Store,
        config: TrainerConfig,
        *,
        eta: int,
        group_size: int,
        tokenizer_dir: str | Path | None = None,
        on_publish: Callable[[int, Decoder], None] | None = None,
        on_published: Callable[[int], None] | None = None,
        abort: Callable[[], BaseException | None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        channel: Channel | None = None,
    ) -> None:
        self.store = with_parents(store)  # a fork resumes from, and tails, its parent's history too
        self.channel = channel or FolderChannel(self.store)
        self.tc = config
        self.eta = eta
        self.group_size = group_size
        self.tokenizer_dir = tokenizer_dir
        self.on_publish = on_publish
        self.on_published = on_published
        self.abort = abort
        self.should_stop = should_stop
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.mesh = make_mesh(self.tc.mesh)
        self.log(f"trainer: mesh {describe_mesh(self.mesh)}")
        if reason := trim_heap_after_compiles():
            self.log(f"trainer: {reason}")
        model, base_version = load_published(self.store, 0, self.mesh)
        if base_version != 0:
            raise RuntimeError(f"{self.store.uri()}: expected the warm start as version 0, found {base_version}")
        self.precision = self.tc.step.precision
        self.model = with_dtype(model, self.precision.params)  # the master weights
        shard_node(self.model, self.mesh)  # committed (a cast's output is not), so the first step compiles once
        self.optimizer = make_nnx_optimizer(self.model, self.tc.optim, self.mesh)
        self.rng = jax.random.key(self.tc.seed)
        self.step = 0
        self.version = 0
        self.checkpointed_step = 0
        # Publications and checkpoints off the loop; a multi-process trainer's writes are collectives: inline.
        self.writes = TrainerWrites(inline=jax.process_count() > 1)
        # What a group must satisfy to be trained on: the group size, the longest row (bucket, model), the vocabulary.
        self.needs = TrainerNeeds.of(group_size=group_size, seq_buckets=config.seq_buckets,
                                     max_seq_len=self.model.cfg.max_seq_len, vocab_size=self.model.cfg.vocab_size,
                                     max_shard_bytes=config.max_shard_bytes, max_shard_rows=config.max_shard_rows)
        self.tailer = self._tailer_at(TailCursor())
        self.metrics: list[dict[str, Any]] = []
        self.idle_s = 0.0
        self._last_wait_log = -1e9
        self._said_no_signal = False
        self.busy_s = 0.0
        self.tokens_trained = 0
        self.pad_id = 0

    # -- resume ------------------------------------------------------------------------------------------
    def restore(self) -> None:
        restored = restore_latest(self.store, model=self.model, optimizer=self.optimizer)
        if restored is not None:
            folder, meta = restored
            self.step, self.version = meta.step, meta.version
            self.checkpointed_step = meta.step
            self.tailer = self._tailer_at(TailCursor.from_json(meta.cursor))
            self.rng = jax.random.wrap_key_data(np.asarray(meta.rng, np.uint32))
            self.log(f"trainer: restored checkpoint {folder} (step {meta.step}, version {meta.version})")
        replayed = 0
        while ConsumptionLog.exists(self.store, self.step + 1):
            entry = ConsumptionLog.read(self.store, self.step + 1)
            cursor = entry.cursor_after_step(self.tailer.cursor,
                                             where=self.store.uri(ConsumptionLog.path_of(entry.step)))
            # read again through the channel; ReplayError: rows not what the step trained on
            groups = reload_step(self.tailer, entry, self.needs, uri=self.store.uri)
            if unknown := undigested(entry):
                self.log(f"trainer: step {entry.step}'s log records no digest for {unknown} group(s) (written before "
                         "digests were): replayed with the trainable checks only")
            self.tailer = self._tailer_at(cursor)
            self._train_on(groups, replay=entry)
            replayed += 1
        if replayed:
            self.log(f"trainer: replayed {replayed} logged step(s) after the checkpoint; now at step {self.step}")

    def _tailer_at(self, cursor: TailCursor) -> GroupSource:
        self._logged_cursor = cursor.copy()
        return self.channel.reader(cursor=cursor, needs=self.needs)

    # -- data --------------------------------------------------------------------------------------------
    def _gather(self) -> tuple[list[GroupSlice], list[ZeroAdvantageGroup], list[TailEvent]] | None:
        """``batch_groups`` useful groups from the window; waits while short (idle time). None when asked to stop
        while waiting (the groups read so far stay unconsumed: the cursor of the last step is what is kept)."""
        groups: list[GroupSlice] = []
        zero_adv: list[ZeroAdvantageGroup] = []
        events: list[TailEvent] = []
        waited_since = None
        while len(groups) < self.tc.batch_groups:
            window = Window(version=self.version, eta=self.eta)
            got = self.tailer.next_groups(self.tc.batch_groups - len(groups), window)
            for e in self.tailer.drain_events():
                events.append(e)
                if e.kind == "skipped":
                    self.log(f"trainer: skipped {len(e.groups)} group(s) of {e.shard}: {e.reason}")
                    if e.reason.startswith(INFRA_REASON):
                        telemetry.count("groups_skipped_infra", len(e.groups))
            had = len(groups)
            for g in got:
                rewards = g.table.column("reward").to_pylist()
                if self.tc.skip_zero_advantage and zero_advantage(rewards):
                    zero_adv.append(ZeroAdvantageGroup(group_id=g.group_id, shard=g.shard, reward=rewards[0]))
                else:
                    groups.append(g)
            # The wait is for groups the step can train on: a stream of all-equal groups (a collapsed policy,
            # or one that solves every task) does not reset it, so such a campaign fails instead of spinning.
            if len(groups) > had:
                waited_since = None
                continue
            now = self.clock()
            if waited_since is None:
                waited_since = now
            elif now - waited_since > self.tc.data_timeout_s:
                raise DataTimeoutError(
                    f"trainer step {self.step + 1}: waited {now - waited_since:.1f}s for groups in "
                    f"{self.store.uri(layout.TRAJECTORIES)}/v{window.start:08d}..v{self.version:08d}; have {len(groups)} of "
                    f"{self.tc.batch_groups}{zero_advantage_summary([z.reward for z in zero_adv])} (are rollout "
                    f"workers running and on weights >= v{window.start}?)"
                )
            if zero_adv and now - self._last_wait_log >= 10.0:
                self._last_wait_log = now
                # Say why a step takes long: all-equal groups carry no gradient and are not trained on.
                self.log(f"trainer: step {self.step + 1} has {len(groups)} of {self.tc.batch_groups} groups"
                         f"{zero_advantage_summary([z.reward for z in zero_adv])}; waiting for more")
            if got:
                continue  # more may be ready: read them before sleeping
            if self.abort is not None and (reason := self.abort()) is not None:
                raise reason
            if jax.process_count() == 1 and self._stop_asked():  # processes agree on a stop between steps only
                return None
            t0 = self.clock()
            with telemetry.span("data_wait", track="trainer", step=self.step + 1, have=len(groups)):
                self.sleep(self.tc.poll_s)
            self.idle_s += self.clock() - t0
        return groups, zero_adv, events

    def _say_why_no_signal(self, groups: list[GroupSlice]) -> None:
        """Once per trainer: why a step's loss and update are zero, when every group it trained on had all-equal
        rewards (``skip_zero_advantage`` off, as in the smoke preset, and a policy that solves nothing yet)."""
        if self._said_no_signal or not no_learning_signal(groups):
            return
        rewards = [g.table.column("reward").to_pylist() for g in groups]
        self._said_no_signal = True
        self.log(f"trainer: all {len(groups)} groups of step {self.step} had all-equal rewards (mean "
                 f"{np.mean([r[0] for r in rewards]):.2f}): zero advantage, so the loss and its gradient are 0: "
                 "nothing to learn from until a group's samples differ in reward (said once)")

    # -- one step ----------------------------------------------------------------------------------------
    def batch(self, groups: list[GroupSlice]):
        """``batch_from_groups`` with this trainer's sizes and estimator."""
        return batch_from_groups(groups, group_size=self.group_size, advantage=self.tc.advantage,
                                 seq_buckets=self.tc.seq_buckets, batch_size=self.tc.batch_groups * self.group_size,
                                 pad_id=self.pad_id)

    def _train_on(
        self,
        groups: list[GroupSlice],
        *,
        replay: ConsumptionLog | None = None,
        zero_adv: list[ZeroAdvantageGroup] | None = None,
        events: list[TailEvent] | None = None,
    ) -> ConsumptionLog:
        t0 = self.clock()
        # Every process of a multi-process trainer must be about to train on the same groups from the same cursor.
        agree(json.dumps([[g.shard, g.row_start, g.row_end] for g in groups] + [self.tailer.cursor.to_json()]),
              f"the groups and tail cursor of step {self.step + 1}")
        with telemetry.span("train_step", track="trainer", step=self.step + 1, groups=len(groups)):
            batch, n_tokens = self.batch(groups)
            with telemetry.span("device", track="chip"):  # from the batch's transfer to its metrics on the host
                metrics = train_step(self.model, self.optimizer, shard_batch(batch, self.mesh), cfg=self.tc.step)
                metrics = {k: float(v) for k, v in metrics.items()}
        if not all(np.isfinite(metrics[k]) for k in ("loss", "grad_norm")):
            raise NonFiniteStepError(
                f"trainer step {self.step + 1}{' (replayed from its log)' if replay else ''}: loss {metrics['loss']} "
                f"grad_norm {metrics['grad_norm']} over groups {[g.group_id for g in groups]} of "
                f"{sorted({g.shard for g in groups})}; nothing of this step was logged, published or checkpointed")
        self.step += 1
        self.tokens_trained += n_tokens
        # A replayed step publishes what its log says it did (a fork replays its parent's steps under its own config).
        publish = (self.step % self.tc.publish_every == 0 or self.step == self.tc.max_steps if replay is None
                   else replay.published_version is not None)
        if replay is None:
            record = ConsumptionLog.of_step(
                step=self.step, trainer_version=self.version, groups=groups, events=events or [],
                zero_advantage=zero_adv or [], published_version=self.version + 1 if publish else None,
                cursor_delta=self.tailer.cursor.delta_json(self._logged_cursor), metrics=metrics)
            if is_writer():
                record.write(self.store)  # the write-ahead record
            self._logged_cursor = self.tailer.cursor.copy()
        else:
            record = replay
        checkpoint = self.step % self.tc.checkpoint_every == 0 or self.step == self.tc.max_steps
        if publish or checkpoint:  # in a replay, the cursor the log led to
            self._write(publish=publish, checkpoint=checkpoint, cursor=self.tailer.cursor)
        # loss, gradient and behaviour–proximal mismatch figures, reward and staleness per step (TensorBoard reads them)
        for name, value in {**metrics, "mean_reward": record.mean_reward, "staleness_max": record.staleness_max}.items():
            if value is not None:
                telemetry.gauge(f"train.{name}", value, step=self.step)
        telemetry.gauge("trainer_version", self.version)
        telemetry.gauge("dropped_stale_groups", self.tailer.cursor.groups_dropped_stale)
        for g in record.groups:
            telemetry.count(f"staleness.{g.staleness}")
        self.busy_s += self.clock() - t0
        self.metrics.append(
            {"step": self.step, **metrics, "mean_reward": record.mean_reward, "staleness_max": record.staleness_max}
        )
        return record

    def _write(self, *, publish: bool, checkpoint: bool, cursor: TailCursor) -> None:
        """Publish the next version (when ``publish``) and checkpoint this step (when ``checkpoint``) through
        ``writes``: the loop pays the hand-over to an in-process engine and the host copies, the writes run meanwhile
        (``train.writer``)."""
        with telemetry.span("publish" if publish else "checkpoint", track="trainer", step=self.step):
            self.writes.wait()  # one step's writes at a time, in step order
            served = None
            if publish:
                self.version += 1
                # Engines serve the compute-dtype copy; the master weights stay in the checkpoint.
                served = with_dtype(self.model, self.precision.compute)
                if self.on_publish is not None:  # before the pointer moves, so a reader of it finds the copy there
                    self.on_publish(self.version, served)
            self.writes.step(self.store, step=self.step, version=self.version, cursor=cursor.to_json(), rng=self.rng,
                             state=checkpoint_state(self.model, self.optimizer) if checkpoint else None,
                             served=served, tokenizer_dir=self.tokenizer_dir, hf=self.tc.publish_hf,
                             # a cast (not the masters the next step donates) that the in-process engine keeps
                             served_kept=self.on_publish is not None and served is not self.model,
                             published=functools.partial(self.on_published, self.version)
                             if publish and self.on_published is not None else None)
        if checkpoint:
            self.checkpointed_step = self.step

    def _stop_asked(self) -> bool:
        return self.should_stop is not None and self.should_stop()

    def _stop_agreed(self) -> bool:
        """``_stop_asked`` on any process: the processes of a multi-host trainer stop at the same step."""
        return any_process(self._stop_asked())

    def _stop(self) -> None:
        """End at a step boundary: checkpoint the steps since the last checkpoint, at the cursor of the last step
        (the groups gathered for the next step are dropped, read again on resume), so a resume replays nothing."""
        if self.step > self.checkpointed_step:
            self._write(publish=False, checkpoint=True, cursor=self._logged_cursor)
        self.writes.wait()
        self.log(f"trainer: stopped at step {self.step}/{self.tc.max_steps} (asked to stop), checkpoint at step "
                 f"{self.checkpointed_step}; no done marker: a rerun continues")

    def run(self, max_steps: int | None = None) -> dict[str, Any]:
        """Train to ``max_steps`` (default and cap: ``trainer.max_steps``) and write the done marker at
        ``trainer.max_steps``; asked to stop, end early (``_stop``). Returns the summary (``stopped`` says which)."""
        target = min(max_steps or self.tc.max_steps, self.tc.max_steps)
        t_start = self.clock()
        stopped = False
        try:
            while self.step < target:
                try:
                    gathered = None if self._stop_agreed() else self._gather()
                except DataTimeoutError as e:
                    e.progress = self._progress(t_start)
                    raise
                if gathered is None:
                    self._stop()
                    stopped = True
                    break
                groups, zero_adv, events = gathered
                record = self._train_on(groups, zero_adv=zero_adv, events=events)
                # A zero loss next to a zero reward reads as a dead run; a step with nothing to learn from says that.
                signal = (f"no learning signal (reward {record.mean_reward:.3f}, equal within every group)"
                          if no_learning_signal(groups) else
                          f"loss {record.metrics['loss']:+.4f} reward {record.mean_reward:.3f}")
                self.log(f"trainer: step {self.step}/{self.tc.max_steps} v{self.version} {signal} staleness<= "
                         f"{record.staleness_max} dropped {self.tailer.cursor.groups_dropped_stale} "
                         f"idle {self.idle_s:.1f}s")
                self._say_why_no_signal(groups)
            self.writes.wait()  # every version published and every checkpoint committed before the done marker
        except BaseException:
            self.writes.finish(self.log)
            raise
        done = self._progress(t_start)
        if self.step >= self.tc.max_steps and is_writer() and not DoneMarker.exists(self.store):
            done.write(self.store)
        return {**done.to_dict(), "stopped": stopped}

    def _progress(self, t_start: float) -> DoneMarker:
        """What this trainer has done since ``t_start``, as of now (the done marker once it reaches its last step)."""
        cursor = self.tailer.cursor
        return DoneMarker(
            steps=self.step, version=self.version, groups_consumed=cursor.groups_consumed,
            groups_dropped_stale=cursor.groups_dropped_stale, shards_skipped=cursor.shards_skipped,
            groups_skipped=cursor.groups_skipped, idle_s=round(self.idle_s, 3), busy_s=round(self.busy_s, 3),
            wall_s=round(self.clock() - t_start, 3), tokens_trained=self.tokens_trained, finished_at=utc_now_iso())


__all__ = ["DataTimeoutError", "NonFiniteStepError", "StreamingTrainer"]
