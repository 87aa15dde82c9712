"""``rollstream drills``: run every reliability drill, merge the figures into ``bench/results.json``, write RELIABILITY.md.

```
fuzz            drills/fuzz.py             hostile inputs × 6 entry points      fuzz_cases, fuzz_crashes
sandbox         drills/sandbox_escapes.py  escape catalogue via PythonTool      sandbox_escapes,
                                           (isolation and resource caps)        sandbox_caps_exceeded
secrets         drills/secrets.py          planted credentials, tiny campaign   secret_leaks
storage faults  drills/storage_faults.py   FaultProxy before a GCS emulator     fault_rate, fault_campaign_ok
bounds          drills/bounds.py           black-hole endpoint, parser floods,  hangs, cli_tracebacks
                                           config bombs, each under a deadline
kills           drills/kills.py            SIGKILL trainer (also mid-publish),  kill_drills, lost_groups, ...
                                           rollout worker, evaluator
poison          drills/poison.py           poisoned shards on a real trainer,   trainer_poison_crashes,
                                           pointer junk, CLI over garbage,      pointer_regressions,
                                           FIFOs/devices under a deadline       cli_tracebacks, hangs
infra           drills/infra_faults.py     sandbox start failures and dependency infra_errors_in_gradient,
                                           timeouts in real episodes, trainer   infra_faults_injected
readpath        drills/readpath.py         read bounds across trainer restarts, readpath_crashes,
                                           rewritten consumed shards, divergence nonfinite_publications
writes          drills/operator_writes.py  each operator write aimed into the   operator_overwrites,
                                           campaign it reads, as a subprocess   operator_files_added
```

A figure two drills both report (``reliability.cli_tracebacks``, ``reliability.hangs``: each drill counts its
own cases) is summed over the drills that ran.

Figures are flat ``reliability.*`` keys merged with ``harness.results.merge_results``, as the benchmarks' are (one
record per run, ``quick`` says which sizes). A full run of some drills (``only``) updates their part of the report
(``with_rerun``). A figure that several drills report (``hangs``, ``cli_tracebacks``: counts of the
same failure over different cases) is their sum. The full drill (``quick=False``: 500 cases per fuzz target, 10 trainer, 5
publish-moment, 20 rollout-worker and 5 evaluator kills) also writes ``bench/reliability.json`` (every detail) and regenerates
``RELIABILITY.md`` from it; a quick run only updates ``bench/results.json``, so the report always shows the
last full drill of each drill. A full run of some drills (``--only``) replaces their details in
``bench/reliability.json`` and keeps the others'; each drill's details carry its own figures and date, and the
report's figures are summed from them. ``drills.report`` renders the report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drills.report import REPORT, render_report
from harness.results import RESULTS, machine_info, merge_results, write_atomically

DETAILS = Path("bench/reliability.json")
NAME = "reliability"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrillSizes:
    fuzz_examples: int
    trainer_kills: int
    publish_kills: int
    """Trainer kills armed while a publication is in flight (``trainer_kill_drill(at_publish=True)``)."""
    rollout_kills: int
    evaluator_kills: int
    fault_rate: float = 0.05

    @classmethod
    def for_mode(cls, quick: bool) -> DrillSizes:
        if quick:
            return cls(fuzz_examples=50, trainer_kills=1, publish_kills=1, rollout_kills=1, evaluator_kills=1)
        return cls(fuzz_examples=500, trainer_kills=10, publish_kills=5, rollout_kills=20, evaluator_kills=5)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _fuzz(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.fuzz import run_fuzz

    tallies = run_fuzz(sizes.fuzz_examples)
    figures = {"reliability.fuzz_cases": float(sum(t.cases for t in tallies.values())),
               "reliability.fuzz_crashes": float(sum(t.crashes for t in tallies.values()))}
    return figures, {name: _plain(t) for name, t in tallies.items()}


def _sandbox(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.sandbox_escapes import isolation_in_use, run_escapes

    outcomes = run_escapes(scratch / "sandbox")
    return ({"reliability.sandbox_escapes": float(sum(not o.contained and not o.cap for o in outcomes)),
             "reliability.sandbox_caps_exceeded": float(sum(not o.contained and o.cap for o in outcomes)),
             "reliability.sandbox_attempts": float(len(outcomes))},
            {"isolation": isolation_in_use(), "attempts": _plain(outcomes)})


def _secrets(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.secrets import run_secret_drill

    report = run_secret_drill(scratch / "secrets", real_rollouts=True, groups=2)
    return {"reliability.secret_leaks": float(len(report.leaks))}, _plain(report)


def _faults(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    import logging

    from drills.storage_faults import fault_figures, run_fault_drill
    from pipelines_lib.storage.emulator import gcs_server

    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # a traceback per retried request otherwise
    logging.getLogger("pipelines_lib.storage.store").setLevel(logging.ERROR)  # retries are counted, not printed
    with gcs_server(scratch / "gcs") as url:
        out = run_fault_drill(url, scratch, rate=sizes.fault_rate, quick=sizes.fuzz_examples < 500,
                              progress=progress)
    return fault_figures(out)


def _bounds(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.bounds import bounds_figures, run_bounds

    quick = sizes.fuzz_examples < 500
    return bounds_figures(run_bounds(scratch, quick=quick), quick=quick)


def _kills(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.kills import evaluator_kill_drill, rollout_kill_drill, trainer_kill_drill

    for name in ("trainer", "publish", "rollout", "evaluator"):
        (scratch / name).mkdir()
    trainer = trainer_kill_drill(scratch / "trainer", kills=sizes.trainer_kills, log=progress)
    publish = trainer_kill_drill(scratch / "publish", kills=sizes.publish_kills, at_publish=True, log=progress)
    rollout = rollout_kill_drill(scratch / "rollout", kills=sizes.rollout_kills, log=progress)
    evaluator = evaluator_kill_drill(scratch / "evaluator", kills=sizes.evaluator_kills, log=progress)
    trainers = (trainer, publish)
    figures = {
        "reliability.kill_drills": float(sum(d.kills for d in (trainer, publish, rollout, evaluator))),
        "reliability.publish_kills": float(publish.kills),
        "reliability.publish_kills_mid_publish": float(sum(where != "outside" for where in publish.landed)),
        "reliability.evaluator_kills": float(evaluator.kills),
        "reliability.lost_groups": float(rollout.lost + sum(t.groups_trained != 2 * t.steps for t in trainers)),
        "reliability.duplicated_groups": float(rollout.duplicated + sum(t.trained_twice for t in trainers)),
        "reliability.partial_visible": float(
            rollout.partial_visible + evaluator.partial_visible
            + sum(state not in ("absent", "complete") for state in evaluator.eval_file_after_kill)
            + sum(t.partial_visible + t.unloadable for t in trainers)),
        "reliability.trainer_bit_identical": float(all(t.bit_identical for t in trainers)),
        "reliability.evaluator_results_identical": float(evaluator.results_identical),
    }
    if evaluator.recover_s is not None:
        figures["reliability.evaluator_recover_s"] = evaluator.recover_s
    for name, gaps in (("trainer", trainer.resume_gaps_s), ("publish", publish.resume_gaps_s),
                       ("rollout", rollout.resume_gaps_s), ("evaluator", evaluator.resume_gaps_s)):
        if gaps:
            figures[f"reliability.resume_gap_s_{name}_median"] = round(statistics.median(gaps), 2)
            figures[f"reliability.resume_gap_s_{name}_max"] = round(max(gaps), 2)
    return figures, {"trainer": _plain(trainer), "publish": _plain(publish), "rollout": _plain(rollout),
                     "evaluator": _plain(evaluator)}


def _poison(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.poison import run_poison_drill

    report = run_poison_drill(scratch, progress)
    return report.figures(), _plain(report)


def _readpath(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.readpath import run_readpath_drill

    report = run_readpath_drill(scratch, progress)
    return report.figures(), _plain(report)


def _infra(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.infra_faults import run_infra_drill

    report = run_infra_drill(scratch, progress=progress)
    return ({"reliability.infra_errors_in_gradient": float(report.infra_errors_in_gradient),
             "reliability.infra_faults_injected": float(report.injected),
             "reliability.infra_groups_not_skipped": float(report.infra_groups - report.groups_skipped_infra)},
            _plain(report))


def _writes(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.operator_writes import run_writes_drill

    report = run_writes_drill(scratch, progress)
    return report.figures(), _plain(report)


DrillFn = Callable[[DrillSizes, Path, Callable[[str], None]], tuple[dict[str, float], dict[str, Any]]]
"""``(sizes, scratch folder, progress) -> (figures, details)``."""

DRILLS: dict[str, DrillFn] = {"fuzz": _fuzz, "sandbox": _sandbox, "secrets": _secrets, "faults": _faults,
                              "bounds": _bounds, "kills": _kills,
                              "poison": _poison, "infra": _infra, "readpath": _readpath,
                              "writes": _writes}


def add_figures(total: dict[str, float], got: dict[str, float]) -> None:
    """Merge one drill's figures into ``total``; a figure already there (another drill's count) adds up."""
    for key, value in got.items():
        total[key] = total.get(key, 0.0) + value


def run_drills(*, quick: bool = False, out_dir: Path = Path("."), progress: Callable[[str], None] = print,
               only: list[str] | None = None) -> dict[str, float]:
    """Run the drills (all, or ``only`` those named), merge figures into ``bench/results.json``; returns them."""
    sizes = DrillSizes.for_mode(quick)
    unknown = sorted(set(only or ()) - set(DRILLS))
    if unknown:
        raise ValueError(f"unknown drill(s) {unknown}; choose from {sorted(DRILLS)}")
    figures: dict[str, float] = {}
    details: dict[str, Any] = {}
    by_drill: dict[str, dict[str, float]] = {}
    start = time.perf_counter()
    for name, fn in DRILLS.items():
        if only and name not in only:
            continue
        progress(f"drill {name} ({'quick' if quick else 'full'}) ...")
        scratch = Path(tempfile.mkdtemp(prefix=f"rollstream-drill-{name}-"))
        t0 = time.perf_counter()
        try:
            got, details[name] = fn(sizes, scratch, progress)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        details[name]["seconds"] = round(time.perf_counter() - t0, 1)
        add_figures(figures, got)
        by_drill[name] = got
        progress(f"drill {name}: {json.dumps(got)} in {details[name]['seconds']} s")
    run = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "quick": quick,
           "seconds": round(time.perf_counter() - start, 1), "machine": machine_info(), "drills": sorted(details)}
    results_path = Path(out_dir) / RESULTS
    previous = json.loads(results_path.read_text()) if results_path.exists() else {}
    kept = {k: v for k, v in previous.get("figures", {}).items() if k.startswith(f"{NAME}.") and k not in figures}
    merged = merge_results(previous, NAME, {**run, "rows": [], "plots": [],
                                            "notes": f"rollstream drills, sizes {dataclasses.asdict(sizes)}"},
                           figures={**kept, **figures})
    write_atomically(results_path, json.dumps(merged, indent=2) + "\n")
    details_path = Path(out_dir) / DETAILS
    if not quick and (not only or details_path.exists()):
        record = {"run": run, "sizes": dataclasses.asdict(sizes), "figures": figures, "details": details,
                  "drill_figures": by_drill}
        if only:  # a full rerun of some drills: the report keeps the others from the last full drill
            record = with_rerun(json.loads(details_path.read_text()), run, by_drill, details)
        write_atomically(details_path, json.dumps(record, indent=2, default=str) + "\n")
        write_atomically(Path(out_dir) / REPORT, render_report(record))
    return figures


def with_rerun(record: dict[str, Any], run: dict[str, Any], by_drill: dict[str, dict[str, float]],
               details: dict[str, Any]) -> dict[str, Any]:
    """``record`` (the last full drill) with some drills rerun in full: their figures replace theirs (a figure
    several drills report is summed again), their details are merged in, and the rerun is listed (pure)."""
    drill_figures = {**record.get("drill_figures", {}), **by_drill}
    fresh = {k for got in drill_figures.values() for k in got}
    figures = {k: v for k, v in record["figures"].items() if k not in fresh}
    for got in drill_figures.values():
        add_figures(figures, got)
    merged = {**record["details"], **{name: {**record["details"].get(name, {}), **d} for name, d in details.items()}}
    reruns = [*record.get("reruns", []), {"date": run["date"], "drills": sorted(by_drill), "machine": run["machine"]}]
    return {**record, "figures": figures, "details": merged, "drill_figures": drill_figures, "reruns": reruns}


__all__ = ["DrillSizes", "add_figures", "run_drills", "with_rerun"]
