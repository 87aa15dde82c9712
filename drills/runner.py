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
report's figures are summed from them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drills.bounds import BOUNDS_MEASURED, render_bounds_section
from drills.storage_faults import FAULT_MEASURED, render_fault_section
from harness.results import RESULTS, machine_info, merge_results, write_atomically

DETAILS = Path("bench/reliability.json")
REPORT = Path("RELIABILITY.md")
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


def _infra(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from drills.infra_faults import run_infra_drill

    report = run_infra_drill(scratch, progress=progress)
    return ({"reliability.infra_errors_in_gradient": float(report.infra_errors_in_gradient),
             "reliability.infra_faults_injected": float(report.injected),
             "reliability.infra_groups_not_skipped": float(report.infra_groups - report.groups_skipped_infra)},
            _plain(report))


DrillFn = Callable[[DrillSizes, Path, Callable[[str], None]], tuple[dict[str, float], dict[str, Any]]]
"""``(sizes, scratch folder, progress) -> (figures, details)``."""

DRILLS: dict[str, DrillFn] = {"fuzz": _fuzz, "sandbox": _sandbox, "secrets": _secrets, "faults": _faults,
                              "bounds": _bounds, "kills": _kills,
                              "poison": _poison, "infra": _infra}


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


def _cell(text: str, limit: int = 160) -> str:
    """One Markdown table cell: no line breaks, pipes escaped, bounded length."""
    return " ".join(str(text).split())[:limit].replace("|", "\\|")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"


MEASURED = {
    "reliability.kill_drills": "SIGKILLs delivered: trainer ({trainer_kills}) + trainer while publishing "
                               "({publish_kills}) + rollout worker ({rollout_kills}) + evaluator ({evaluator_kills}), "
                               "each at a seeded random moment after the process reported progress.",
    "reliability.publish_kills": "Trainer SIGKILLs armed when storage showed a publication in flight (newest "
                                 "`weights/v<N>/` without its marker, or LATEST behind it), 0-0.05 s later.",
    "reliability.publish_kills_mid_publish": "Publish kills that left a publication unfinished (unmarked newest "
                                             "folder, or LATEST not yet moved): the kill landed inside it.",
    "reliability.evaluator_kills": "Evaluator SIGKILLs, each at a uniform moment in the first 80 % of an "
                                   "uninterrupted evaluation (weight load, compile, episodes).",
    "reliability.evaluator_results_identical": "1 when the evaluation that finished after the kills equals an "
                                               "uninterrupted one of the same version on a copy in every field but "
                                               "`wall_s` (greedy and seeded sampled episodes; same machine).",
    "reliability.evaluator_recover_s": "Seconds from the last evaluator kill to the restarted evaluation's commit "
                                       "of `eval/v<N>.json` (it starts over: there is nothing to resume).",
    "reliability.lost_groups": "Rollout: groups in shards whose commit a killed-and-restarted worker had "
                               "acknowledged (its `committed` log line) that are no longer readable; trainer: 1 if "
                               "fewer groups were trained than the fixed shards hold.",
    "reliability.duplicated_groups": "Group ids committed more than once by the logical rollout worker across its "
                                     "restarts, plus groups named by two trainer consumption logs.",
    "reliability.partial_visible": "Non-hidden objects (shards, JSON/JSONL) in the killed campaigns that fail to "
                                   "read after the kills (hidden `.tmp-` temporaries are allowed and counted apart); "
                                   "plus, checked after every trainer kill, weights versions that LATEST names or "
                                   "that carry a marker but do not load, and evaluator `eval/v<N>.json` files "
                                   "present but incomplete.",
    "reliability.trainer_bit_identical": "1 when both killed trainers' (random-moment and publish-moment) final "
                                         "parameters equal an uninterrupted run's on a copy of the same shards, bit "
                                         "for bit.",
    **FAULT_MEASURED,
    **BOUNDS_MEASURED,
    "reliability.fuzz_cases": "Hypothesis cases over 6 entry points ({fuzz_examples} each): tool-call parsers, "
                              "calculator, YAML config, shards (+ tailer), dataset files, the operator's commands "
                              "on damaged campaigns.",
    "reliability.fuzz_crashes": "Cases where an entry point raised an undocumented exception, an error without the "
                                "file/key in its message, (calculator) took over 1 s, or (a command) printed a "
                                "traceback.",
    "reliability.sandbox_escapes": "Catalogue attempts not contained: a connection reached the loopback server, "
                                   "a file outside was read/changed/created, the parent's credential appeared, the "
                                   "attempt's own success signal appeared, or processes (any carrying the drill's "
                                   "marker, wherever reparented) / folders were left behind.",
    "reliability.sandbox_caps_exceeded": "Catalogue attempts on a resource cap that got past it: a write into a "
                                         "hidden folder's mask or past the work dir's size, SysV IPC or memfd "
                                         "memory granted, processes or threads past max_processes, a sandbox init "
                                         "without the program's limits.",
    "reliability.sandbox_attempts": "Attempts in the escape catalogue, through the python tool with the default "
                                    "isolation backend; most (hook_off_*) attack the containment mechanism itself.",
    "reliability.infra_errors_in_gradient": "Trained groups (consumption logs) holding a trajectory whose sandbox "
                                            "or dependency failed past its retry budget: sandbox start failures and "
                                            "dependency timeouts injected into real arithmetic episodes (real "
                                            "agent, episode runner and calculator), a real trainer over the shards.",
    "reliability.infra_faults_injected": "Infrastructure faults raised in the infra drill's episodes (retried ones "
                                         "included); a third of its groups outlast the budget, a third recover.",
    "reliability.infra_groups_not_skipped": "Groups with an infra_error trajectory that no consumption log skips "
                                            "with an infrastructure-failure reason.",
    "reliability.trainer_poison_cases": "Poisoned-shard cases, each a real trainer (tiny decoder) run to its last "
                                        "step over a real campaign folder holding valid shards and one poisoned "
                                        "shard: wrong group size, row over the largest bucket, 20 M-token row "
                                        "declared in a small file, out-of-vocabulary and negative ids, a 3e38 "
                                        "reward, unpublished policy version, interleaved groups, copies (same folder, other version, "
                                        "re-encoded), FIFO and symlink-out named like a shard.",
    "reliability.trainer_poison_crashes": "Poisoned-shard cases where the trainer raised, did not finish, trained a "
                                          "poisoned group or a group twice, left a poisoned group out of its "
                                          "consumption logs' `skipped` entries, or the audit did not report it.",
    "reliability.pointer_cases": "Junk entries planted beside `weights/LATEST` at v2: `latest.json`, `zzz.json`, a "
                                 "name disagreeing with its version, negative or string version, non-JSON, non-object, "
                                 "FIFO, symlink out of the campaign.",
    "reliability.pointer_regressions": "Pointer cases where LATEST read as anything but v2, the next advance did not "
                                       "take, or the audit did not report the entry.",
    "reliability.cli_cases": "`rollstream` subprocess runs over garbage metadata (eval, consumption-log, checkpoint "
                             "and pointer names, truncated and malformed telemetry lines, a foreign file in the export "
                             "folder) and over folders that are no campaign (`file:///etc`, `\"\"`), plus the URL "
                             "and timeout cases of other drills.",
    "reliability.cli_tracebacks": "Of those runs: a traceback, an exit code other than documented (audits of a "
                                  "non-campaign: 2 with `not a campaign`) or no end within the deadline.",
    "reliability.hang_cases": "Runs with a FIFO and a character device named like a shard, a FIFO as pointer entry "
                              "and as telemetry file: `audit`, `export`, `status`, `metrics` and the tailer, each a "
                              "subprocess with a 120 s deadline (plus other drills' deadline cases).",
    "reliability.hangs": "Of those runs: still running at the deadline (killed), or failed.",
    "reliability.secret_leaks": "(secret, file) pairs where a planted fake credential appears in the campaign "
                                "folder, trace, audit report or captured logs (Arrow files searched decoded).",
}


def render_report(record: dict[str, Any]) -> str:
    """RELIABILITY.md from the last full drill's record (pure)."""
    figures, details, sizes, run = record["figures"], record["details"], record["sizes"], record["run"]
    m = run["machine"]
    out = ["# Reliability", "",
           "Generated by `rollstream drills` (`make drills`) from `bench/reliability.json`, the last **full** drill; "
           "do not edit by hand. `rollstream drills --quick` runs the same drills smaller and only updates "
           "`bench/results.json`.", "",
           f"**Last full drill.** {run['date']}, {run['seconds']:.0f} s; {m.get('cpus')} CPUs, {m.get('memory_gb')} GiB, "
           f"load {m.get('load_1min')}, Python {m.get('python')}.", "",
           *[line for r in record.get("reruns", []) for line in (  # a paragraph each
               f"**Rerun since.** {r['date']}: {', '.join(r['drills'])}, full sizes; load "
               f"{r['machine'].get('load_1min')}. Their figures and sections below are from that run.", "")],
           "| figure | value | how it was measured |", "|---|---|---|"]
    for key in sorted(figures):
        how = MEASURED.get(key, "")
        if "resume_gap" in key:
            how = ("Seconds from a SIGKILL to the restarted process's next trained step (trainer; publish: after "
                   "replaying and re-publishing the killed step) / next committed shard (rollout) / `started` line "
                   "(evaluator: process start and imports): process start, imports, restore, compile (from the "
                   "persistent cache).")
        out.append(f"| `{key}` | {_fmt(figures[key])} | {how.format(**sizes)} |")
    out.append("")
    if "fuzz" in details:
        out += ["## Fuzzing", "", "| target | cases | crashes | first crash |", "|---|---|---|---|"]
        for name, t in details["fuzz"].items():
            if isinstance(t, dict) and "cases" in t:
                first = _cell(t["examples"][0]) if t["examples"] else ""
                out.append(f"| {name} | {t['cases']} | {t['crashes']} | {first} |")
        out.append("")
    if "sandbox" in details:
        sb = details["sandbox"]
        out += ["## Sandbox escape catalogue", ""]
        if "date" in sb:
            out += [f"Run on its own, full size, {sb['date']}.", ""]
        if "isolation" in sb:
            out += [f"Isolation backend in use: {sb['isolation']}. Attempts named `hook_off_*` first neutralise the "
                    "audit hook (through the garbage collector or the frame of the error it raised); only the OS "
                    "isolation stands between them and the host.", ""]
        out += ["| attempt | contained | seconds | problems |", "|---|---|---|---|"]
        out += [f"| {a['name']} | {'yes' if a['contained'] else '**NO**'} | {a['seconds']} | "
                f"{_cell('; '.join(a['problems']), 300)} |" for a in details["sandbox"]["attempts"]]
        out.append("")
    if "kills" in details:
        k = details["kills"]
        out += ["## Kill drills", ""]
        for name, label in (("trainer", "Trainer"), ("publish", "Trainer, killed while publishing")):
            t = k[name]
            out.append(f"- {label}: {t['kills']} kills over {t['starts']} starts, {t['steps']} steps, "
                       f"{t['groups_trained']} groups trained, {t['trained_twice']} twice, bit-identical: "
                       f"{t['bit_identical']}, where the kills landed in a publication: {dict(Counter(t['landed']))}, unloadable "
                       f"versions {t['unloadable']}, resume gaps (s): {t['resume_gaps_s']}.")
        r, e = k["rollout"], k["evaluator"]
        out += [f"- Rollout worker: {r['kills']} kills over {r['starts']} starts, {r['groups_committed']} groups "
                f"committed ({r['acknowledged_groups']} acknowledged before a kill or exit), lost {r['lost']}, "
                f"duplicated {r['duplicated']}, partial visible {r['partial_visible']}, hidden orphans "
                f"{r['orphans']}, resume gaps (s): {r['resume_gaps_s']}.",
                f"- Evaluator (v{e['version']}): {e['kills']} kills over {e['starts']} starts, `eval/v<N>.json` after "
                f"each kill: {dict(Counter(e['eval_file_after_kill']))}, results identical to an uninterrupted evaluation: "
                f"{e['results_identical']} (greedy: {e['greedy_identical']}), uninterrupted {e['reference_s']} s, "
                f"recovered {e['recover_s']} s after the last kill, resume gaps (s): {e['resume_gaps_s']}.", ""]
    if "poison" in details:
        out += ["## Poisoned data and junk metadata", "", "| catalogue | case | held | seconds | problems |",
                "|---|---|---|---|---|"]
        for group in ("poison", "pointers", "metadata", "fifos"):
            out += [f"| {group} | {c['name']} | {'yes' if c['ok'] else '**NO**'} | {c['seconds']} | "
                    f"{_cell('; '.join(c['problems']), 300)} |" for c in details["poison"][group]]
        out.append("")
    if "faults" in details:
        out += render_fault_section(details["faults"])
    if "cases" in details.get("bounds", {}):
        out += render_bounds_section(details["bounds"])
    return "\n".join(out).rstrip() + "\n"


__all__ = ["DrillSizes", "add_figures", "render_report", "run_drills", "with_rerun"]
