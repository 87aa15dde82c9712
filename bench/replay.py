"""Replay benchmark: a logged training step recomputed from storage gives the logged floats."""

from __future__ import annotations

from bench.registry import BenchContext, BenchResult, Goal, register_bench


@register_bench(
    "replay",
    title="Replaying a training step",
    measures="Whether `rollstream replay` reproduces a step's logged loss and gradient norm exactly (`identical`: "
             "1 when every replayed step gives the same floats as its consumption log), and its wall time.",
    method="A small trainer campaign (1-layer decoder, synthetic groups, 4 steps of 2 groups; checkpoints at steps "
           "2 and 4) trained in-process, then every step replayed on the same CPU backend: steps 1-2 from the warm "
           "start, steps 3-4 from checkpoint 2.",
    goals=(Goal(key="replay.identical", op=">=", value=1, why="a replay must reproduce its step bit for bit"),),
)
def replay_bench(ctx: BenchContext) -> BenchResult:
    import time

    from harness.fixtures import seed_trainer_campaign, small_trainer_config
    from pipelines_lib.stages.replay import replay
    from pipelines_lib.stages.train import train

    config = small_trainer_config(4, checkpoint_every=4)
    store = seed_trainer_campaign(str(ctx.scratch / "replay"), config, 8)
    train(store, config, log=lambda _: None)
    rows = []
    for step in (1, 2, 3, 4):
        t0 = time.monotonic()
        result = replay(store, step, log=lambda _: None)
        rows.append({"step": step, "from_checkpoint": result["from_checkpoint"], "identical": result["identical"],
                     "loss": result["loss"]["recomputed"], "seconds": round(time.monotonic() - t0, 2)})
        ctx.progress(f"replay step {step}: identical={result['identical']}")
    return BenchResult(figures={"replay.identical": float(all(r["identical"] for r in rows)),
                                "replay.step4_s": rows[-1]["seconds"]}, rows=rows)
