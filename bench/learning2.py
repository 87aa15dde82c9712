"""Benchmark ``learning2``: does streaming GRPO teach the policy something it could not do, not just a format?

The campaign of ``learning`` on the ``twostep`` task (the ``twostep`` recipe, ``recipes/twostep.yaml``: two calculator calls, the
first result carried into the second). Its warm start answers in the right form (one integer in
``<answer>``) but often answers after one call, with the intermediate result; the gain has to come from
making the second call and carrying the right number. The preset is written to a config file once and the
campaign command runs on it (``--config``), so the run is the one a user gets from that file. Figures, as in
``learning``: held-out greedy success and pass@k per version (the versions between v0 and the last evaluated
after the timed command), the gain in points, and the wall clock of the whole command; plus the share of v0's
greedy answers that are well-formed.
"""

from __future__ import annotations

import yaml

from bench.learning import learning_run
from bench.registry import BenchContext, BenchResult, Goal, register_bench
from pipelines_lib.config import CampaignConfig

QUICK: dict[str, object] = {"sft.steps": 40, "sft.optim.total_steps": 40, "trainer.max_steps": 4,
                            "eval.n_tasks": 16, "trainer.skip_zero_advantage": False}
"""A smoke run: every stage, no meaningful gain."""


@register_bench(
    "learning2",
    title="Learning a capability: two-step arithmetic with a one-operation calculator",
    measures="Held-out greedy success of the warm-started policy (v0) and of the last published version on the "
             "`twostep` task, the gain in points, the share of v0's greedy answers that are well-formed (one integer "
             "in `<answer>`: the gain is not a format fix), pass@k per version, and the wall clock of the whole "
             "campaign command.",
    method="`python -m flows.campaign --config <the twostep recipe as YAML> --set eval.versions=ends` (tiny decoder, "
           "2 rollout workers and the trainer as threads of one process, light tool latency, Prefect's ephemeral "
           "API); results read back from the campaign folder, the versions between v0 and the last evaluated after "
           "the timed command. `--quick`: 40 SFT steps, 4 trainer steps, 16 held-out tasks (a smoke run).",
    goals=(Goal(key="learning2.v0_format_ok", op=">=", value=0.9, why="v0 already answers in the right format"),
           Goal(key="learning2.heldout_gain_pts", op=">=", value=20.0, why="+20 points from capability, not format"),
           Goal(key="learning2.wallclock_s", op="<=", value=900.0, why="within 15 minutes on 2 cores")),
)
def learning2(ctx: BenchContext) -> BenchResult:
    config = CampaignConfig.preset("twostep")
    if ctx.quick:
        config = config.with_overrides(QUICK)
    config_path = ctx.scratch / "twostep.yaml"
    config_path.write_text(yaml.safe_dump(config.to_dict()))
    run = learning_run(ctx, ["--config", str(config_path)], plot="learning2_curve.png",
                       title="warm start + streaming GRPO (tiny model, two-step arithmetic)")
    first, last = run.evals[min(run.evals)], run.evals[max(run.evals)]
    return BenchResult(
        figures={"learning2.v0_format_ok": first["format"], **run.figures("learning2"),
                 "learning2.final_format_ok": last["format"]},
        rows=run.rows, plots=["learning2_curve.png"], notes=f"run: {run.summary}; quick={ctx.quick}")
