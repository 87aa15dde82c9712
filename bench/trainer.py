"""Benchmarks ``trainer`` (the streaming trainer's tokens/s next to a bare train loop) and ``publish``.

```
prepare (untimed)   synthetic whole groups → the folder channel's writer → trajectories/v00000000/ in a local folder;
                    weights v0 published
streaming arm       StreamingTrainer.run: tail shards, skip zero-advantage groups, build the batch,
                    train_step, write train/consumed/<step>.json          (publication and checkpoints off)
bare arm            train_step on the very batches the streaming arm trained on (rebuilt from its
                    consumption logs before timing), in memory, no storage
```

``publish`` (its own benchmark, so its figures keep the ``publish.`` prefix): ``measure_pickup_latency``, from
``publish_weights`` returning to a polling reader's ``latest()`` seeing the version and its ``load()`` done.

In ``trainer``, both arms train the same tiny model from the same v0 weights on the same groups in the same order, and each
is warmed up with one step on the first batch before anything is timed, so compilation is excluded from
both in the same way. Each repetition times a few streaming steps and a few bare steps, streaming first in
even repetitions (bare on the batches just trained) and bare first in odd ones (bare on the previous
repetition's batches), so neither arm always runs in the other's wake. Every batch has the same padded shape,
so a train step costs the same whatever rows it holds: the per-repetition ratio is bare seconds per step over
streaming seconds per step (on the same batches, exactly the tokens/s ratio), and the headline figure is the
median over repetitions.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import jax
from flax import nnx

from bench.plots import barh
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib.config import CampaignConfig
from pipelines_lib.mesh import shard_node
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import load_published, measure_pickup_latency, publish_weights
from pipelines_lib.records import ConsumptionLog
from pipelines_lib.stages.train import trainer_for
from pipelines_lib.storage.store import Store
from pipelines_lib.train.batch import TrainBatch
from pipelines_lib.train.optim import make_nnx_optimizer
from pipelines_lib.train.reload import reload_step
from pipelines_lib.train.step import train_step
from pipelines_lib.train.trainer import StreamingTrainer
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.synthetic import synthetic_group

QUICK = {"repeats": 2, "steps": 1}
FULL = {"repeats": 4, "steps": 4}
NEVER = 10**9
"""``publish_every`` / ``checkpoint_every`` / ``max_steps`` of the benchmark's trainer: the arms compare the
data path; publication is measured on its own by the ``publish`` benchmark."""


def bench_config() -> CampaignConfig:
    """``CampaignConfig.tiny()`` (8 groups of 4 per step, one 192-token bucket) without publications."""
    base = CampaignConfig.tiny()
    return dataclasses.replace(base, trainer=dataclasses.replace(
        base.trainer, max_steps=NEVER, publish_every=NEVER, checkpoint_every=NEVER))


def write_shards(store: Store, config: CampaignConfig, n_groups: int) -> None:
    """``n_groups`` synthetic groups of version 0 in shards of 16 groups, then weights v0."""
    writer = FolderChannel(store).writer("bench", WriterConfig(max_groups=16, max_age_s=1e9))
    for i in range(n_groups):
        writer.add_group(synthetic_group(prompt_id=f"p{i:05d}", group_size=config.rollout.group_size,
                                         worker_id="bench", policy_version=0, seed=i,
                                         vocab_size=config.model.vocab_size, max_len=config.trainer.seq_buckets[-1]))
    writer.flush()
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(config.seed)), version=0, step=0)


def logged_batches(trainer: StreamingTrainer, steps: range) -> list[tuple[TrainBatch, int]]:
    """(batch, loss tokens) of each step the trainer logged, rebuilt from the shard rows its log names."""
    out = []
    for step in steps:
        entry = ConsumptionLog.read(trainer.store, step)
        batch, n_tokens = trainer.batch(reload_step(trainer.tailer, entry, trainer.needs, uri=trainer.store.uri))
        out.append((batch, n_tokens))
    return out


def _plot(path: Path, rows: list[dict]) -> None:
    barh(path, [r["arm"] for r in rows], [r["loss tokens/s"] for r in rows], colors=["tab:blue", "tab:gray"],
         xlabel="loss tokens/s (median over repetitions)", title="streaming GRPO trainer vs bare train_step loop",
         figsize=(6, 2.2))


@register_bench(
    "trainer",
    title="Streaming trainer overhead and weight pickup latency",
    measures="Loss tokens/s of the streaming GRPO trainer (tailing shards from a local campaign folder) over a "
             "bare in-memory loop of `train_step` on the same batches; and the publish→pickup latency: from "
             "`publish_weights` returning to a polling `CampaignWeights(store)` reader seeing the version and "
             "finishing its `load` (local folder).",
    method="`CampaignConfig.tiny()` trainer (tiny model, 8 groups × 4 samples per step, one 192-token bucket, "
           "GRPO loss) with publication and checkpoints switched off. Synthetic whole groups (lengths up to "
           "~120 tokens, random 0/1 rewards, so some groups are skipped for zero advantage exactly as in a "
           "campaign) are written as shards of 16 groups before timing. Streaming arm: `StreamingTrainer.run` "
           "(tailing, shard reads, batch building, `train_step`, consumption log). Bare arm: `train_step` on the "
           "batches the streaming arm trained on, rebuilt from its consumption logs before timing, same "
           "initial weights. Both are warmed up with one step (compilation excluded from both), then "
           "each repetition times a few steps of each arm, in alternating order, every step synchronised to "
           "the host. All batches have one padded shape (32 × 192), so `streaming_over_bare` = bare s/step over "
           "streaming s/step (the tokens/s ratio on equal batches), median over repetitions.",
    goals=(Goal(key="trainer.streaming_over_bare", op=">=", value=0.9,
                why="reading shards should cost little next to the train step"),),
)
def bench_trainer(ctx: BenchContext) -> BenchResult:
    size = QUICK if ctx.quick else FULL
    config = bench_config()
    steps_total = 1 + size["repeats"] * size["steps"]
    store = Store(str(ctx.scratch / "campaign"))
    # About 1/8 of random-reward groups of 4 are all-equal and skipped; 1.5x leaves a wide margin.
    write_shards(store, config, n_groups=int(1.5 * steps_total * config.trainer.batch_groups) + 16)

    trainer = trainer_for(store, config, log=lambda line: None)
    trainer.run(max_steps=1)
    bare_model, _ = load_published(store, 0)
    shard_node(bare_model, trainer.mesh)
    bare_optimizer = make_nnx_optimizer(bare_model, config.trainer.optim, trainer.mesh)
    [(warm_batch, _)] = logged_batches(trainer, range(1, 2))
    jax.block_until_ready(train_step(bare_model, bare_optimizer, warm_batch, cfg=config.trainer.step))

    def bare_run(batches: list[tuple[TrainBatch, int]]) -> tuple[float, int]:
        t0 = time.perf_counter()
        for batch, _ in batches:
            jax.block_until_ready(train_step(bare_model, bare_optimizer, batch, cfg=config.trainer.step))
        return time.perf_counter() - t0, sum(n for _, n in batches)

    streaming_tps, bare_tps, ratios = [], [], []
    previous: list[tuple[TrainBatch, int]] = []
    for rep in range(size["repeats"]):
        # Odd repetitions time the bare arm first (on the previous repetition's batches) to cancel order effects.
        bare_first = rep % 2 == 1
        if bare_first:
            bare_s, bare_tokens = bare_run(previous)
        first, tokens0 = trainer.step + 1, trainer.tokens_trained
        t0 = time.perf_counter()
        trainer.run(max_steps=trainer.step + size["steps"])
        streaming_s = time.perf_counter() - t0
        previous = logged_batches(trainer, range(first, trainer.step + 1))
        if not bare_first:
            bare_s, bare_tokens = bare_run(previous)
        streaming_tps.append((trainer.tokens_trained - tokens0) / streaming_s)
        bare_tps.append(bare_tokens / bare_s)
        ratios.append(bare_s / streaming_s)
        ctx.progress(f"bench trainer: repetition {rep + 1}/{size['repeats']}: {streaming_s / size['steps']:.3f} "
                     f"s/step streaming, {bare_s / size['steps']:.3f} s/step bare")

    figures = {
        "trainer.streaming_over_bare": statistics.median(ratios),
        "trainer.streaming_tokens_per_s": statistics.median(streaming_tps),
        "trainer.bare_tokens_per_s": statistics.median(bare_tps),
        "trainer.steps_timed": size["repeats"] * size["steps"],
    }
    rows = [
        {"arm": "streaming trainer", "loss tokens/s": figures["trainer.streaming_tokens_per_s"],
         "per-repetition": ", ".join(f"{x:.0f}" for x in streaming_tps)},
        {"arm": "bare train_step", "loss tokens/s": figures["trainer.bare_tokens_per_s"],
         "per-repetition": ", ".join(f"{x:.0f}" for x in bare_tps)},
    ]
    plot = "trainer_throughput.png"
    _plot(ctx.plot_dir / plot, rows)
    notes = (f"{size['repeats']} repetitions × {size['steps']} steps per arm after 1 warm-up step; per-repetition "
             f"ratios {', '.join(f'{r:.3f}' for r in ratios)}.")
    return BenchResult(figures=figures, rows=rows, plots=[plot], notes=notes)


@register_bench(
    "publish",
    title="Weight publication: publish→pickup latency",
    measures="Seconds from `publish_weights` returning to a rollout-style reader (`CampaignWeights(store)`, "
             "polling `latest()`) seeing the new version and finishing its `load`, on a local campaign folder; "
             "also the publish call itself (`save_s`) and the reader's load (`load_s`).",
    method="`publish.measure_pickup_latency` with the tiny model: the reader polls every 50 ms in a thread "
           "(so up to 50 ms of the latency is polling delay), one untimed warm-up publication first (Orbax "
           "start-up), then one publication per version; medians over publications.",
    goals=(Goal(key="publish.pickup_latency_s", op="<=", value=1.0,
                why="workers should be on new weights within a second of publication"),),
)
def bench_publish(ctx: BenchContext) -> BenchResult:
    publications = 3 if ctx.quick else 8
    config = bench_config()
    store = Store(str(ctx.scratch / "campaign"))
    model = Decoder(config.model, rngs=nnx.Rngs(config.seed))
    publish_weights(store, model, version=0, step=0)
    runs = [measure_pickup_latency(store, model, version=v, step=v) for v in range(1, publications + 1)]
    figures = {key: statistics.median(r[key] for r in runs)
               for key in ("publish.pickup_latency_s", "publish.save_s", "publish.load_s")}
    rows = [{"version": v, "save s": r["publish.save_s"], "pickup latency s": r["publish.pickup_latency_s"],
             "load s": r["publish.load_s"]} for v, r in enumerate(runs, start=1)]
    return BenchResult(figures=figures, rows=rows, notes=f"{publications} publications after one warm-up.")
