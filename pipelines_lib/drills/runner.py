"""``rollstream drills``: run every reliability drill, merge the figures into ``bench/results.json``, write RELIABILITY.md.

```
fuzz            drills/fuzz.py             hostile inputs × 5 entry points      fuzz_cases, fuzz_crashes
sandbox         drills/sandbox_escapes.py  escape catalogue via PythonTool      sandbox_escapes
secrets         drills/secrets.py          planted credentials, tiny campaign   secret_leaks
storage faults  drills/storage_faults.py   FaultProxy before a GCS emulator     fault_rate, fault_campaign_ok
kills           drills/kills.py            SIGKILL trainer / rollout worker     kill_drills, lost_groups, ...
```

Figures are flat ``reliability.*`` keys merged with the bench framework's ``merge_results`` (one record per
run, ``quick`` says which sizes). The full drill (``quick=False``: 500 cases per fuzz target, 10 trainer and
20 rollout-worker kills) also writes ``bench/reliability.json`` (every detail) and regenerates
``RELIABILITY.md`` from it; a quick run only updates ``bench/results.json``, so the report always shows the
last full drill.
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

from pipelines_lib.bench.registry import BenchResult
from pipelines_lib.bench.runner import RESULTS, _write_atomically, machine_info, merge_results
from pipelines_lib.drills.storage_faults import FAULT_MEASURED, render_fault_section

DETAILS = Path("bench/reliability.json")
REPORT = Path("RELIABILITY.md")
NAME = "reliability"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrillSizes:
    fuzz_examples: int
    trainer_kills: int
    rollout_kills: int
    fault_rate: float = 0.05

    @classmethod
    def for_mode(cls, quick: bool) -> DrillSizes:
        return cls(fuzz_examples=50, trainer_kills=1, rollout_kills=1) if quick else cls(
            fuzz_examples=500, trainer_kills=10, rollout_kills=20)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _fuzz(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from pipelines_lib.drills.fuzz import run_fuzz

    tallies = run_fuzz(sizes.fuzz_examples)
    figures = {"reliability.fuzz_cases": float(sum(t.cases for t in tallies.values())),
               "reliability.fuzz_crashes": float(sum(t.crashes for t in tallies.values()))}
    return figures, {name: _plain(t) for name, t in tallies.items()}


def _sandbox(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from pipelines_lib.drills.sandbox_escapes import run_escapes

    outcomes = run_escapes(scratch / "sandbox")
    return ({"reliability.sandbox_escapes": float(sum(not o.contained for o in outcomes)),
             "reliability.sandbox_attempts": float(len(outcomes))}, {"attempts": _plain(outcomes)})


def _secrets(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from pipelines_lib.drills.secrets import run_secret_drill

    report = run_secret_drill(scratch / "secrets", real_rollouts=True, groups=2)
    return {"reliability.secret_leaks": float(len(report.leaks))}, _plain(report)


def _faults(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    import logging

    from pipelines_lib.drills.storage_faults import fault_figures, run_fault_drill
    from pipelines_lib.storage.emulator import gcs_server

    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # a traceback per retried request otherwise
    logging.getLogger("pipelines_lib.storage.store").setLevel(logging.ERROR)  # retries are counted, not printed
    with gcs_server(scratch / "gcs") as url:
        out = run_fault_drill(url, scratch, rate=sizes.fault_rate, quick=sizes.fuzz_examples < 500,
                              progress=progress)
    return fault_figures(out)


def _kills(sizes: DrillSizes, scratch: Path, progress: Callable[[str], None]) -> tuple[dict[str, float], dict[str, Any]]:
    from pipelines_lib.drills.kills import rollout_kill_drill, trainer_kill_drill

    (scratch / "trainer").mkdir()
    (scratch / "rollout").mkdir()
    trainer = trainer_kill_drill(scratch / "trainer", kills=sizes.trainer_kills, log=progress)
    rollout = rollout_kill_drill(scratch / "rollout", kills=sizes.rollout_kills, log=progress)
    figures = {
        "reliability.kill_drills": float(trainer.kills + rollout.kills),
        "reliability.lost_groups": float(rollout.lost + (trainer.groups_trained != 2 * trainer.steps)),
        "reliability.duplicated_groups": float(rollout.duplicated + trainer.trained_twice),
        "reliability.partial_visible": float(rollout.partial_visible + trainer.partial_visible),
        "reliability.trainer_bit_identical": float(trainer.bit_identical),
    }
    for name, gaps in (("trainer", trainer.resume_gaps_s), ("rollout", rollout.resume_gaps_s)):
        if gaps:
            figures[f"reliability.resume_gap_s_{name}_median"] = round(statistics.median(gaps), 2)
            figures[f"reliability.resume_gap_s_{name}_max"] = round(max(gaps), 2)
    return figures, {"trainer": _plain(trainer), "rollout": _plain(rollout)}


DrillFn = Callable[[DrillSizes, Path, Callable[[str], None]], tuple[dict[str, float], dict[str, Any]]]
"""``(sizes, scratch folder, progress) -> (figures, details)``."""

DRILLS: dict[str, DrillFn] = {"fuzz": _fuzz, "sandbox": _sandbox, "secrets": _secrets, "faults": _faults,
                              "kills": _kills}


def run_drills(*, quick: bool = False, out_dir: Path = Path("."), progress: Callable[[str], None] = print,
               only: list[str] | None = None) -> dict[str, float]:
    """Run the drills (all, or ``only`` those named), merge figures into ``bench/results.json``; returns them."""
    sizes = DrillSizes.for_mode(quick)
    unknown = sorted(set(only or ()) - set(DRILLS))
    if unknown:
        raise ValueError(f"unknown drill(s) {unknown}; choose from {sorted(DRILLS)}")
    figures: dict[str, float] = {}
    details: dict[str, Any] = {}
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
        figures.update(got)
        progress(f"drill {name}: {json.dumps(got)} in {details[name]['seconds']} s")
    run = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "quick": quick,
           "seconds": round(time.perf_counter() - start, 1), "machine": machine_info()}
    results_path = Path(out_dir) / RESULTS
    previous = json.loads(results_path.read_text()) if results_path.exists() else {}
    kept = {k: v for k, v in previous.get("figures", {}).items() if k.startswith(f"{NAME}.") and k not in figures}
    merged = merge_results(previous, NAME, BenchResult(figures={**kept, **figures},
                                                       notes=f"rollstream drills, sizes {dataclasses.asdict(sizes)}"),
                           run)
    _write_atomically(results_path, json.dumps(merged, indent=2) + "\n")
    if not quick and not only:
        record = {"run": run, "sizes": dataclasses.asdict(sizes), "figures": figures, "details": details}
        _write_atomically(Path(out_dir) / DETAILS, json.dumps(record, indent=2, default=str) + "\n")
        _write_atomically(Path(out_dir) / REPORT, render_report(record))
    return figures


def _cell(text: str, limit: int = 160) -> str:
    """One Markdown table cell: no line breaks, pipes escaped, bounded length."""
    return " ".join(str(text).split())[:limit].replace("|", "\\|")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"


MEASURED = {
    "reliability.kill_drills": "SIGKILLs delivered: trainer ({trainer_kills}) + rollout worker ({rollout_kills}), "
                               "each at a seeded random moment 0-1 s after the process reported progress.",
    "reliability.lost_groups": "Rollout: groups in shards whose commit a killed-and-restarted worker had "
                               "acknowledged (its `committed` log line) that are no longer readable; trainer: 1 if "
                               "fewer groups were trained than the fixed shards hold.",
    "reliability.duplicated_groups": "Group ids committed more than once by the logical rollout worker across its "
                                     "restarts, plus groups named by two trainer consumption logs.",
    "reliability.partial_visible": "Non-hidden objects (shards, JSON/JSONL) in both campaigns that fail to read "
                                   "after the kills (hidden `.tmp-` temporaries are allowed and counted apart).",
    "reliability.trainer_bit_identical": "1 when the killed trainer's final parameters equal an uninterrupted "
                                         "run's on a copy of the same shards, bit for bit.",
    **FAULT_MEASURED,
    "reliability.fuzz_cases": "Hypothesis cases over 5 entry points ({fuzz_examples} each): tool-call parsers, "
                              "calculator, YAML config, shards (+ tailer), dataset files.",
    "reliability.fuzz_crashes": "Cases where an entry point raised an undocumented exception, an error without the "
                                "file/key in its message, or (calculator) took over 1 s.",
    "reliability.sandbox_escapes": "Catalogue attempts not contained: a connection reached the loopback server, "
                                   "a file outside was read/changed, the parent's credential appeared, or processes "
                                   "/ folders were left behind.",
    "reliability.sandbox_attempts": "Attempts in the escape catalogue.",
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
           "| figure | value | how it was measured |", "|---|---|---|"]
    for key in sorted(figures):
        how = MEASURED.get(key, "")
        if "resume_gap" in key:
            how = ("Seconds from a SIGKILL to the next trained step (trainer) / next committed shard (rollout) of "
                   "the restarted process: process start, imports, restore, compile (from the persistent cache).")
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
        out += ["## Sandbox escape catalogue", "", "| attempt | contained | seconds | problems |", "|---|---|---|---|"]
        out += [f"| {a['name']} | {'yes' if a['contained'] else '**NO**'} | {a['seconds']} | "
                f"{_cell('; '.join(a['problems']), 300)} |" for a in details["sandbox"]["attempts"]]
        out.append("")
    if "kills" in details:
        t, r = details["kills"]["trainer"], details["kills"]["rollout"]
        out += ["## Kill drills", "",
                f"- Trainer: {t['kills']} kills over {t['starts']} starts, {t['steps']} steps, {t['groups_trained']} "
                f"groups trained, {t['trained_twice']} twice, bit-identical: {t['bit_identical']}, resume gaps (s): "
                f"{t['resume_gaps_s']}.",
                f"- Rollout worker: {r['kills']} kills over {r['starts']} starts, {r['groups_committed']} groups "
                f"committed ({r['acknowledged_groups']} acknowledged before a kill or exit), lost {r['lost']}, "
                f"duplicated {r['duplicated']}, partial visible {r['partial_visible']}, hidden orphans "
                f"{r['orphans']}, resume gaps (s): {r['resume_gaps_s']}.", ""]
    if "faults" in details:
        out += render_fault_section(details["faults"])
    return "\n".join(out).rstrip() + "\n"


__all__ = ["DrillSizes", "render_report", "run_drills"]
