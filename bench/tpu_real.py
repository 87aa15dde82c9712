"""Benchmark ``tpu_real``: a Qwen3-0.6B-shaped campaign colocated on one accelerator chip, memory planned.

```
export      random weights of the ``tpu_real`` preset's model on the device, written by the project's HF export
warm-up     a throw-away campaign of two steps from that folder: the programs compiled before any measured window
campaign    run_colocated of ``tpu_real`` started from that folder (the HF import), in a fresh folder, with no tool
            latency: the memory plan, the device's peak memory (its arrays; and, polled through the campaign, its
            arrays with the scratch the runtime reserves for programs: ``MemoryWatch``), trajectories/hour, trained
            tokens/s, the hand-over of each version (``hand_over`` spans), the chip's busy share, the shares of the
            window the trainer's loop spent at publications and checkpoints, the writer spent writing them, the
            rollout worker spent waiting for its budget or fresher weights and its writer spent holding groups of a
            version not yet stored, and the mean seconds a version's write took
alone       the engine alone at the campaign's slots and KV pool, serving prompts of the campaign's mean prompt length;
            the trainer alone at the campaign's batch (rows × largest bucket), 1 + 3 steps
campaign    the same with ``LatencyProfile.heavy()``, in another fresh folder, if ``--budget-s`` affords it
campaign    no tool latency again with ``rollout.lead_versions: 1`` (the worker one version's groups ahead of the
            trainer, so that a version's write need not hold the rollouts up), figures ``*_lead``, if affordable
time share  rollout tokens/s in the campaign ÷ the engine alone + trained tokens/s in the campaign ÷ the trainer alone
```

The order keeps what one command can measure: a command whose budget runs out after the first campaign and the parts
alone still records the memory, the hand-over and the time share without tool latency (``heavy_skipped`` says so).

A campaign's rates are over its steady window, from the first step's consumption log to the last one's (the first
step's compilation and the start-up left out): trained tokens count every row of the steps after the first padded to
the largest bucket, as the trainer alone counts them; rollout tokens are the tokens the engine generated
(``loss_mask``) of the trajectories overlapping the window, each prorated by its overlap. The preset's 8 steps of 128
rows keep the three campaigns, the export and the parts alone within one device command of 10 minutes (about 7 on a
v5e). ``--quick`` (and ``measure_real(quick=True)``, which the test suite runs on a CPU) does the same with the model
shrunk and 2 steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import gc
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.registry import BenchContext, BenchResult, Budget, Goal, PartialResult, register_bench
from bench.tpu import SERVE_TIMEOUT_S, accelerator

QUICK_REAL = ("model.vocab_size=1024", "model.d_model=64", "model.n_layers=2", "model.n_heads=2",
              "model.n_kv_heads=1", "model.head_dim=32", "model.d_ff=128", "trainer.max_steps=2",
              "trainer.batch_groups=2", "trainer.publish_every=1", "rollout.max_groups_per_version=2",
              "eval.n_tasks=2", "dataset.n_train=64", "dataset.n_heldout=4", "engine.num_slots=8",
              "rollout.max_concurrency=8", "memory.device_gib=4.0")
"""``tpu_real`` cut to seconds on a CPU: a small model (its vocabulary still past the tokenizer's), two steps, each
publishing (so that version 1's rollouts and write fall inside the window between the two steps' logs)."""
GIB = 2**30


class MemoryWatch:
    """The largest ``bytes_in_use + bytes_reserved`` that ``stats()`` (a device's ``memory_stats``) reported while
    watching, polled every ``interval_s`` on a thread of its own: the arrays and the memory a TPU runtime reserves
    for its programs' scratch, which ``peak_bytes_in_use`` leaves out. None where ``stats`` reports neither."""

    def __init__(self, stats: Callable[[], dict[str, int] | None], *, interval_s: float = 0.05) -> None:
        self._stats, self._interval_s = stats, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="memory-watch", daemon=True)
        self.peak_bytes: int | None = None

    def _poll(self) -> None:
        while True:
            stats = self._stats() or {}
            if "bytes_in_use" in stats or "bytes_reserved" in stats:
                used = stats.get("bytes_in_use", 0) + stats.get("bytes_reserved", 0)
                self.peak_bytes = max(used, self.peak_bytes or 0)
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _iso_s(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def export_random(config: Any, folder: Path, cache: Path) -> Path:
    """``config.model`` with random weights built on the device, written by the project's HF export into ``folder``
    with the embedded tokenizer's files."""
    from pipelines_lib.mesh import MeshConfig, create_sharded, make_mesh
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.model.hf_export import save_hf_checkpoint
    from pipelines_lib.model.tokenizer import tokenizer_dir

    model = create_sharded(lambda rngs: Decoder(config.model, rngs=rngs), make_mesh(MeshConfig()))
    save_hf_checkpoint(model, folder, tokenizer_dir=tokenizer_dir(None, cache=cache))
    del model
    gc.collect()
    return folder


def steady_rates(store: Any, config: Any) -> dict[str, float]:
    """The campaign's rates over its steady window (module docstring), its hand-overs and the prompts' mean length."""
    from pipelines_lib.records import ConsumptionLog, DoneMarker
    from pipelines_lib.storage import layout
    from pipelines_lib.telemetry.trace import chip_busy, read_records
    from pipelines_lib.trajectory.codec import read_shard

    steps = DoneMarker.read(store).steps
    start, end = (_iso_s(ConsumptionLog.read(store, s).created_at) for s in (1, steps))
    window = end - start
    rows = config.trainer.batch_groups * config.rollout.group_size
    generated = prompts = trajectories = count = 0.0
    for path in store.walk(layout.TRAJECTORIES):
        if layout.parse_shard_path(path) is None:
            continue
        table, _ = read_shard(store, path)
        for mask, timings in zip(table.column("loss_mask").to_pylist(), table.column("timings").to_pylist(),
                                 strict=True):
            began_s, ended_s = _iso_s(timings["started_at"]), _iso_s(timings["finished_at"])
            overlap = max(0.0, min(ended_s, end) - max(began_s, start)) / max(ended_s - began_s, 1e-9)
            generated += sum(mask) * overlap
            trajectories += overlap
            prompts += mask.index(1) if 1 in mask else len(mask)
            count += 1
    spans = [r for r in read_records(store) if r.get("type") == "span"]
    hand_overs = [r["dur_us"] / 1e6 for r in spans if r["name"] == "hand_over"]
    version_writes = [r["dur_us"] / 1e6 for r in spans
                      if r["name"] == "write" and "version" in r.get("tags", {}).get("what", "")]

    def share(name: str, track: str) -> float:  # of the window, the spans of that name on that track
        return sum(max(0, min(r["ts_us"] + r["dur_us"], end * 1e6) - max(r["ts_us"], start * 1e6)) for r in spans
                   if r["name"] == name and r["track"] == track) / 1e6 / window

    return {"window_s": window, "rollout_tokens_per_s": generated / window,
            "trained_tokens_per_s": (steps - 1) * rows * config.trainer.seq_buckets[-1] / window,
            "trajectories_per_hour": 3600 * trajectories / window, "handover_s": statistics.mean(hand_overs),
            "handover_max_s": max(hand_overs), "mean_prompt": prompts / max(count, 1),
            "chip_busy": chip_busy(spans, int(start * 1e6), int(end * 1e6)),
            "publish_wait_share": share("publish", "trainer") + share("checkpoint", "trainer"),
            "write_share": share("write", "writer"),
            "rollout_wait_share": share("backpressure_wait", "weights") + share("admission_wait", "weights"),
            "commit_hold_share": share("commit_hold", "writer"),
            "version_write_s": statistics.mean(version_writes) if version_writes else 0.0}


def engine_alone(store: Any, config: Any, *, prompt: int) -> float:
    """Generated tokens/s of the engine alone: the campaign's engine config (its planned pool), the last published
    version, two requests a slot of ``prompt`` tokens and ``rollout.max_new_tokens`` each, after a warm-up."""
    from pipelines_lib.engine import JaxEngine, SamplingParams
    from pipelines_lib.publish import load_published

    model, _ = load_published(store)
    engine = JaxEngine(model, config.engine)
    slots = config.engine.num_slots

    async def serve(engine: JaxEngine) -> float:
        await asyncio.wait_for(engine.warmup(), SERVE_TIMEOUT_S)
        t0 = time.perf_counter()
        done = await asyncio.wait_for(asyncio.gather(*[
            engine.generate([(7 * i + 3 * k) % 500 + 1 for i in range(prompt)],
                            SamplingParams(temperature=1.0, max_new_tokens=config.rollout.max_new_tokens, seed=k))
            for k in range(2 * slots)]), SERVE_TIMEOUT_S)
        wall = time.perf_counter() - t0
        await engine.close()
        return sum(len(c.token_ids) for c in done) / wall

    rate = asyncio.run(serve(engine))
    del engine, model
    gc.collect()
    return rate


def trainer_alone(store: Any, config: Any) -> float:
    """Trained tokens/s of the trainer alone: version 0 as float32 masters (``precision.params``), the campaign's
    optimizer and step, rows × largest bucket of uniform ids; the median of 3 steps after the compiling one."""
    from bench.realsize import _batch, _uniform_tokens
    from pipelines_lib.mesh import MeshConfig, make_mesh, shard_node
    from pipelines_lib.model.decoder import with_dtype
    from pipelines_lib.publish import load_published
    from pipelines_lib.train.optim import make_nnx_optimizer
    from pipelines_lib.train.step import train_step

    mesh = make_mesh(MeshConfig())
    model = with_dtype(load_published(store, 0, mesh)[0], config.trainer.step.precision.params)
    shard_node(model, mesh)
    optimizer = make_nnx_optimizer(model, config.trainer.optim, mesh)
    rows, length = config.trainer.batch_groups * config.rollout.group_size, config.trainer.seq_buckets[-1]
    batch = _batch(_uniform_tokens(rows, length, min(model.cfg.vocab_size, 512)))
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        float(train_step(model, optimizer, batch, cfg=config.trainer.step)["loss"])
        times.append(time.perf_counter() - t0)
    del model, optimizer
    gc.collect()
    return rows * length / statistics.median(times[1:])


def measure_real(scratch: Path, *, quick: bool, log: Callable[[str], None] = print,
                 budget: Budget | None = None) -> dict[str, float]:
    """The benchmark (module docstring) in this process; figures without the ``tpu.real.`` prefix. The campaign with
    no tool latency and the parts alone come first; the heavy campaign, then the lead campaign, each run only if
    ``budget`` affords one more campaign as long as the first took (a third more, for its tools' waits): without it,
    ``heavy_skipped`` (``lead_skipped``) is 1 and that campaign's figures are missing."""
    import jax

    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.configio import parse_overrides
    from pipelines_lib.envs.tools.latency import LatencyProfile
    from pipelines_lib.stages.colocated import run_colocated
    from pipelines_lib.storage.store import Store

    base = CampaignConfig.build(preset="tpu_real", overrides=parse_overrides(QUICK_REAL) if quick else None)
    folder = export_random(base, scratch / "hf-random", scratch / "cache")
    out: dict[str, float] = {}

    def campaign(name: str, latency: LatencyProfile, lead: int = 0) -> tuple[Any, dict[str, Any]]:
        config = dataclasses.replace(base, init_from=str(folder), env=dataclasses.replace(base.env, tool_latency=latency),
                                     rollout=dataclasses.replace(base.rollout, lead_versions=lead))
        store = Store(str(scratch / f"campaign-{name}"))
        ran = run_colocated(store, config, cache=scratch / "cache", log=log)
        if not ran["audit"]["ok"]:
            raise RuntimeError(f"the tpu_real campaign ({name} latency)'s audit failed: {ran['audit']['report']}")
        out.update({f"{k}_{name}": v for k, v in steady_rates(store, config).items()})
        out[f"campaign_wall_s_{name}"] = ran["wall_s"]
        return store, ran

    # A process's first campaign compiles its engine's and trainer's programs as it meets their shapes, inside its
    # window; a throw-away campaign of two steps meets them first.
    warmup = dataclasses.replace(base, init_from=str(folder), trainer=dataclasses.replace(base.trainer, max_steps=2))
    run_colocated(Store(str(scratch / "campaign-warmup")), warmup, cache=scratch / "cache", log=log)
    with MemoryWatch(jax.devices()[0].memory_stats) as watch:
        store, ran = campaign("none", LatencyProfile.none())
    stats = jax.devices()[0].memory_stats() or {}
    out.update(campaign_fits=1.0, hbm_plan_gib=ran["memory_plan"]["total_bytes"] / GIB,
               kv_blocks=ran["memory_plan"]["kv_blocks"])
    if "peak_bytes_in_use" in stats:
        out["hbm_peak_gib"] = stats["peak_bytes_in_use"] / GIB
    if "peak_bytes_reserved" in stats:  # a TPU runtime's programs' scratch, which bytes_in_use does not count
        out["hbm_reserved_peak_gib"] = stats["peak_bytes_reserved"] / GIB
    if watch.peak_bytes is not None:
        out["hbm_used_peak_gib"] = watch.peak_bytes / GIB
        out["hbm_plan_error"] = abs(out["hbm_used_peak_gib"] / out["hbm_plan_gib"] - 1)
    # the engine alone at the pool the campaign's plan gave it
    config = dataclasses.replace(base, engine=dataclasses.replace(base.engine, num_blocks=int(out["kv_blocks"])))
    out["engine_alone_tokens_per_s"] = engine_alone(store, config, prompt=round(out["mean_prompt_none"]))
    out["trainer_alone_tokens_per_s"] = trainer_alone(store, config)
    out["trajectories_per_hour"], out["trained_tokens_per_s"] = (out["trajectories_per_hour_none"],
                                                                 out["trained_tokens_per_s_none"])
    names = ["none"]
    # the goal's second campaign, then no tool latency again with the worker a version ahead (rollout.lead_versions)
    for name, latency, lead in (("heavy", LatencyProfile.heavy(), 0), ("lead", LatencyProfile.none(), 1)):
        if budget is None or budget.affords(ran["wall_s"] * 4 / 3):
            campaign(name, latency, lead)
            names.append(name)
        else:
            log(f"tpu_real: the {name} campaign does not fit what is left of --budget-s (the first took "
                f"{ran['wall_s']:.0f} s); not run")
            out[f"{name}_skipped"] = 1.0
    out["handover_s"] = max(out[f"handover_s_{name}"] for name in names if name != "lead")
    for name in names:
        out[f"time_share_{name}"] = (out[f"rollout_tokens_per_s_{name}"] / out["engine_alone_tokens_per_s"]
                                     + out[f"trained_tokens_per_s_{name}"] / out["trainer_alone_tokens_per_s"])
    return out


@register_bench(
    "tpu_real",
    title="A Qwen3-0.6B-shaped campaign colocated on one accelerator chip, memory planned",
    measures="Whether the campaign fits one chip, its peak device memory against the memory plan, trajectories per "
             "hour, trained tokens per second, the hand-over of each version, and how much of the chip the rollouts "
             "and the trainer each get beside the other, without and with slow tools.",
    method="`bench/tpu_real.py` `measure_real`, in this process: random weights of the `tpu_real` preset's model "
           "(Qwen3-0.6B's shape, bfloat16) exported by `save_hf_checkpoint`, a throw-away campaign of 2 steps (the "
           "programs compiled before any window), then three colocated campaigns of the preset from that folder "
           "(`init_from`: the HF import), 8 steps of 128 rows each: no tool latency first, then the engine alone and "
           "the trainer alone at the campaign's sizes, then `LatencyProfile.heavy()` if `--budget-s` affords it (else "
           "`tpu.real.heavy_skipped`), then no latency again with `rollout.lead_versions: 1` if it affords that too "
           "(figures `*_lead`, else `tpu.real.lead_skipped`); the memory plan's total and the device's "
           "`peak_bytes_in_use` after the first (arrays only: a TPU runtime reserves its programs' scratch apart, "
           "`peak_bytes_reserved`, recorded as `hbm_reserved_peak_gib` where reported), and the largest sum of the two "
           "polled every 50 ms during that campaign (`hbm_used_peak_gib`, against the plan: `hbm_plan_error` = |used "
           "peak / plan - 1|); rates over each campaign's "
           "steady window (module docstring); "
           "`handover_s`: the slower of the none and heavy campaigns' mean `hand_over` span; time share = the two "
           "ratios summed; per campaign the chip's busy share of the window (`chip_busy_<latency>`), the share the "
           "trainer's loop spent at publications and checkpoints (`publish_wait_share_<latency>`), the share the "
           "writer thread spent writing them (`write_share_*`), the share the rollout worker waited for its budget or "
           "fresher weights (`rollout_wait_share_*`), the share its writer held finished groups until their version "
           "was stored (`commit_hold_share_*`, `rollout.swap_at_hand_over`) and the mean seconds a version's write took "
           "(`version_write_s_*`). `--quick`: the model shrunk, 2 steps. Skipped without an accelerator.",
    goals=(Goal(key="tpu.real.campaign_fits", op=">=", value=1.0, why="a 0.6B campaign on one chip"),
           Goal(key="tpu.real.hbm_used_peak_gib", op="<=", value=15.0,
                why="a v5e chip holds 15.7 GiB (arrays and the programs' reserved scratch)"),
           Goal(key="tpu.real.hbm_plan_error", op="<=", value=0.1, why="the plan predicts the peak within 10 %"),
           Goal(key="tpu.real.handover_s", op="<=", value=1.0, why="rollouts wait for no version"),
           Goal(key="tpu.real.time_share_none", op=">=", value=0.8, why="the two share the chip with little lost"),
           Goal(key="tpu.real.time_share_heavy", op=">=", value=1.2, why="asynchrony fills the chip while tools wait")),
    prefixes=("tpu.real.",),
)
def bench_tpu_real(ctx: BenchContext) -> BenchResult:
    from pipelines_lib.memplan import MemoryPlanError

    kind, _ = accelerator()
    try:
        measured = measure_real(ctx.scratch, quick=ctx.quick, log=ctx.progress, budget=Budget(ctx.budget_s))
    except MemoryPlanError as e:  # the plan refused the campaign: that it does not fit is the figure
        raise PartialResult(BenchResult(figures={"tpu.real.campaign_fits": 0.0}, labels={"tpu.real.device": kind},
                                        notes=f"{kind}; refused by the memory plan: {e}"), str(e)) from e
    plan, peak = measured["hbm_plan_gib"], measured.get("hbm_used_peak_gib")
    return BenchResult(figures={f"tpu.real.{k}": v for k, v in measured.items()}, labels={"tpu.real.device": kind},
                       notes=f"{kind}; {'quick: small model' if ctx.quick else 'Qwen3-0.6B shape'}; plan "
                             f"{plan:.2f} GiB, peak used and reserved "
                             f"{'not reported' if peak is None else f'{peak:.2f} GiB'}"
                             + ("; the heavy campaign not run: it did not fit --budget-s (no time_share_heavy)."
                                if measured.get("heavy_skipped") else "."))
