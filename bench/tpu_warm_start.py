"""Benchmark ``tpu_warm_start``: how robust the chip ablation's warm start is over seeds, per candidate recipe.

Every arm of an ablation seed starts from that seed's warm start (v0). When v0's held-out success moves a lot
between seeds, one target success cannot serve every seed: a seed whose v0 is already above it, or whose sync
never gets there, anchors no time-to-target ratio. This benchmark measures only that part, cheaply, for the
``tpu_ablation`` recipe and a few candidate changes to its warm start:

```
per candidate c (CANDIDATES: overrides over the screened recipe), per seed s (5 by default; --seeds)
  warm start    colocated SFT into <scratch>/<c>/seed<s> (v0 published)
  evaluate v0   EVAL_TASKS held-out tasks: greedy success, and SAMPLES sampled episodes per task at the
                rollout's temperature (the share a GRPO group of v0 sees rewarded: its learning signal)
ledger          bench/tpu_warm_start_runs.json: per candidate, keyed by its config's fingerprint and the chip;
                a later command runs only what is missing
```

Figures per candidate: v0 greedy success in points over seeds (mean, min, spread, interval), sampled success,
and the seconds a warm start and its evaluation take. The candidates change only the warm start (SFT length,
demonstrations, their flaws) and the task (``env.options``); the ablation's arms and the RL recipe are untouched.
What a candidate is judged on: a v0 spread within ``tpu.ablation.v0_pts_spread``'s goal, and sampled success that
leaves GRPO something to learn. The first sweep's choice, and why no candidate met the goal: docs/ABLATION.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.registry import BenchContext, BenchResult, BenchSkipped, Budget, register_bench
from bench.seeds import OverSeeds
from bench.tpu_ablation import config_fingerprint, shared_config
from harness.results import write_atomically
from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import EvalResult
from pipelines_lib.storage.store import Store

NAME = "tpu_warm_start"
SCREENED_ON: dict[str, Any] = {"env.options": {}, "eval.max_concurrency": 32}
"""The ``tpu_ablation`` recipe as the candidates were screened against it, over today's: flawed demonstrations of
both kinds (none of twostep's options set), 32 evaluation episodes at once. The recipe has since adopted
``carry_only``'s demonstrations (and a wider evaluation); pinning what was screened keeps each candidate's config,
and so its fingerprint and its measured seeds, what they were."""
CANDIDATES: dict[str, dict[str, Any]] = {
    "both_flaws": {},
    "carry_only": {"env.options": {"mistakes": ["wrong_carry"]}},
    "carry_900": {"env.options": {"mistakes": ["wrong_carry"]}, "sft.steps": 900, "sft.optim.total_steps": 900},
    "error_85": {"sft.error_rate": 0.85},
    "error_75": {"sft.error_rate": 0.75},
    "digits2": {"env.options": {"operand_digits": 2}},
    "sft_900": {"sft.steps": 900, "sft.optim.total_steps": 900},
    "demos_2048": {"sft.n_demos": 2048, "sft.steps": 900, "sft.optim.total_steps": 900},
}
"""What each candidate changes in the screened recipe's warm start (``SCREENED_ON``), in the order a command runs
them: nothing (half the flawed demonstrations answer after one call, half carry a near-miss number into the second);
flawed demonstrations that all make the second call and only carry a wrong number (no greedy choice between answering
early and going on, which both kinds of flaw put near even odds), alone and with three times the SFT steps; fewer
flawed demonstrations (that choice further from even odds); two-digit operands (a harder carry); three times the SFT
steps on the same demonstrations; twice the demonstrations over those steps (the flawed share is drawn per
demonstration, so more of them hold it closer to its expectation; twostep has about 2,400 distinct train tasks)."""
QUICK_CANDIDATES = ("both_flaws", "error_75")
EVAL_TASKS = 256
"""Held-out tasks per v0 evaluation (as many as the ablation's evaluation scores), so a spread over seeds is the
model's more than the sample's: a seed's success to about 3 points."""
SAMPLES = 4
DEFAULT_SEEDS = 5
LEDGER = Path("bench/tpu_warm_start_runs.json")


def candidate_config(name: str, *, quick: bool, seed: int) -> CampaignConfig:
    """The screened ``tpu_ablation`` config of ``seed`` (``SCREENED_ON``; no tool latency: it plays no part here)
    with candidate ``name``'s overrides and the evaluation's size."""
    base = shared_config(quick=quick, seed=seed, profile="none")
    tasks = 4 if quick else EVAL_TASKS
    return base.with_overrides({**SCREENED_ON, **CANDIDATES[name], "eval.n_tasks": tasks,
                                "eval.samples": 1 if quick else SAMPLES,
                                "dataset.n_heldout": max(tasks, base.dataset.n_heldout)})


def check_candidates(names: Sequence[str], *, quick: bool) -> None:
    """Refuse, before anything runs, a candidate whose warm start cannot be made: one asking for more
    demonstrations than its env has distinct train tasks would otherwise stop the command minutes in."""
    for name in names:
        config = candidate_config(name, quick=quick, seed=0)
        try:
            config.env.generate_tasks(seed=config.sft.seed, n=config.sft.n_demos, split="train")
        except ValueError as err:
            raise ValueError(f"{NAME}: candidate {name!r} ({json.dumps(CANDIDATES[name])}): {err}") from err


def load_ledger(path: Path, device: str) -> dict[str, Any]:
    """The ledger at ``path`` if it was measured on ``device``; else an empty one."""
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("device") == device:
            return data
    return {"device": device, "candidates": {}}


def measure(scratch: Path, config: CampaignConfig, log: Callable[[str], None]) -> dict[str, float]:
    """One warm start and its v0 evaluation in ``scratch``: greedy and sampled success, seconds of each."""
    from pipelines_lib.stages.evaluate import evaluate
    from pipelines_lib.stages.prep import prep
    from pipelines_lib.stages.warm_start import warm_start

    store = Store(str(scratch))
    prep(store, config)  # the held-out split v0 is scored on
    t0 = time.monotonic()
    warm_start(store, config, cache=scratch.parent / "cache", log=log)
    t1 = time.monotonic()
    evaluate(store, config, version=0, cache=scratch.parent / "cache", log=log)
    result = EvalResult.read(store, 0)
    return {"v0_greedy": result.greedy_success_rate,
            "v0_sampled": float((result.sampled or {}).get("success_rate", float("nan"))),
            "warm_start_s": round(t1 - t0, 2), "eval_s": round(time.monotonic() - t1, 2)}


def run(ctx: BenchContext, *, device: str, ledger_path: Path, live: bool = True) -> BenchResult:
    """Measure what the ledger lacks for ``ctx``'s seeds (``live``), then every figure from the whole ledger."""
    names = QUICK_CANDIDATES if ctx.quick else tuple(CANDIDATES)
    seeds = ctx.seed_list(1 if ctx.quick else DEFAULT_SEEDS)
    ledger = load_ledger(ledger_path, device)
    if live:
        check_candidates(names, quick=ctx.quick)
    budget, longest, skipped = Budget(ctx.budget_s), 0.0, []
    for name in names if live else ():
        fp = config_fingerprint(candidate_config(name, quick=ctx.quick, seed=0))  # a changed candidate starts afresh
        entry = ledger["candidates"].get(name)
        if entry is None or entry["fingerprint"] != fp:
            entry = ledger["candidates"][name] = {"fingerprint": fp, "runs": {}}
        for seed in seeds:
            if str(seed) in entry["runs"]:
                continue
            if not budget.affords(longest):
                skipped.append(f"{name} seed {seed}")
                continue
            ctx.progress(f"{NAME}: {name}, seed {seed}")
            t0 = time.monotonic()
            figures = measure(ctx.scratch / name / f"seed{seed}",
                              candidate_config(name, quick=ctx.quick, seed=seed), ctx.progress)
            longest = max(longest, time.monotonic() - t0)
            entry["runs"][str(seed)] = figures
            write_atomically(ledger_path, json.dumps(ledger, indent=1, sort_keys=True) + "\n")
            ctx.progress(f"{NAME}: {name}, seed {seed}: v0 {figures['v0_greedy']:.1%} greedy, "
                         f"{figures['v0_sampled']:.1%} sampled")
    figures: dict[str, float] = {}
    rows = []
    for name, entry in sorted(ledger["candidates"].items()):
        runs = [entry["runs"][s] for s in sorted(entry["runs"], key=int)]
        if not runs:
            continue
        greedy = OverSeeds(tuple(100 * r["v0_greedy"] for r in runs))
        sampled = OverSeeds(tuple(100 * r["v0_sampled"] for r in runs))
        key = f"tpu.warm_start.{name}"
        figures |= greedy.figures(f"{key}.v0_pts") | {
            f"{key}.v0_sampled_pts": round(sampled.mean, 2), f"{key}.seeds": float(len(runs)),
            f"{key}.warm_start_s": round(sum(r["warm_start_s"] for r in runs) / len(runs), 2)}
        rows.append({"candidate": name, "overrides": json.dumps(CANDIDATES.get(name, {})),
                     "seeds": ",".join(sorted(entry["runs"], key=int)), "v0 greedy, pts": greedy.text(),
                     "v0 sampled, pts": f"{sampled.mean:.1f}"})
    notes = (("" if live else f"Rendered from the ledger on a machine without an accelerator: every figure was "
              f"measured on {device}. ") + f"v0 of {4 if ctx.quick else EVAL_TASKS} held-out tasks per seed. "
             + (f"Left for a later command (budget): {', '.join(skipped)}. " if skipped else "")
             + f"Ledger {ledger_path}.")
    return BenchResult(figures=figures, rows=rows, notes=notes, labels={"tpu.warm_start.device": device})


@register_bench(
    NAME,
    title="The chip ablation's warm start over seeds: how far v0 moves, per candidate recipe",
    measures="Per candidate warm start (the tpu_ablation recipe as screened and changes to its SFT and task), over "
             "seeds: v0's held-out greedy success (mean, min, spread, interval), its sampled success (a GRPO "
             "group's learning signal) and the seconds a warm start takes.",
    method="`bench/tpu_warm_start.py` (module docstring): colocated SFT per (candidate, seed) from the "
           "`tpu_ablation` recipe as screened (`SCREENED_ON`), v0 evaluated on 256 held-out tasks (greedy and 4 "
           "sampled episodes each); results accumulate in `bench/tpu_warm_start_runs.json` (`--seeds`, `--budget-s`). Skipped without an "
           "accelerator, where the committed ledger's figures are rendered.",
    prefixes=("tpu.warm_start.",),
)
def bench_tpu_warm_start(ctx: BenchContext) -> BenchResult:
    from bench.tpu import accelerator

    ledger = ctx.scratch / "ledger.json" if ctx.quick else ctx.plot_dir.parent / LEDGER
    try:
        kind, _ = accelerator()
    except BenchSkipped:
        if ctx.quick or not ledger.exists():
            raise
        device = json.loads(ledger.read_text())["device"]
        ctx.progress(f"{NAME}: no accelerator here: the figures of {ledger} ({device}), nothing run")
        return run(ctx, device=device, ledger_path=ledger, live=False)
    return run(ctx, device=kind, ledger_path=ledger)
