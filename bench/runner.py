"""Run registered benchmarks, merge their figures into ``bench/results.json``, regenerate ``BENCHMARKS.md``.

``bench/results.json`` is the record::

    {"figures": {"store.write_over_pyarrow": <number>, ...},      # flat, every benchmark ever run
     "labels": {"tpu.device": "TPU v5 lite", ...},                 # text figures, the same way
     "runs": {"store": {"date", "quick", "seconds", "machine", "rows", "plots", "notes"}}}

A run replaces the figures of the benchmarks it ran (all keys under their prefix, so renamed figures do not
linger) and keeps everything else. A benchmark that fails does not stop the others: its traceback is printed,
the next one runs, and once every benchmark has run ``BenchmarksFailed`` names the failed ones (a benchmark that
raised ``PartialResult`` has the figures it measured recorded first). ``BENCHMARKS.md`` is rendered from that file plus each benchmark's
registration (what, how, goals), so it always shows the latest run of every benchmark, whichever ran last; the
figures blocks of the README and ``docs/`` are re-rendered from it too (``bench.figures``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.figures import documents, rerender
from bench.registry import (
    Bench,
    BenchContext,
    BenchResult,
    BenchSkipped,
    PartialResult,
    key_owner,
    load_benches,
)

RESULTS = Path("bench/results.json")
REPORT = Path("BENCHMARKS.md")


def machine_info() -> dict[str, Any]:
    """What the figures depend on: CPU, memory, load (other jobs share small machines), library versions."""
    import numpy
    import pyarrow

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_1min": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "numpy": numpy.__version__,
    }


def check_result(name: str, result: BenchResult, benches: Mapping[str, Bench] | None = None) -> None:
    for key, value in {**result.figures, **result.labels}.items():
        owner = key_owner(key, dict(benches)) if benches else key.split(".", 1)[0]
        if owner != name:
            raise ValueError(f"benchmark {name!r} returned figure {key!r}: keys must start with '{name}.' "
                             "or a prefix it registered")
        if key in result.labels:
            if not isinstance(value, str):
                raise ValueError(f"benchmark {name!r} returned label {key!r} = {value!r}: must be text")
        elif not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"benchmark {name!r} returned figure {key!r} = {value!r}: must be a finite number")


def merge_results(previous: Mapping[str, Any], name: str, result: BenchResult, run: Mapping[str, Any],
                  benches: Mapping[str, Bench] | None = None) -> dict[str, Any]:
    """``previous`` with benchmark ``name``'s figures and run record replaced by this run's (pure)."""
    def owner(key: str) -> str:
        return key_owner(key, dict(benches)) if benches else key.split(".", 1)[0]

    figures = {k: v for k, v in previous.get("figures", {}).items() if owner(k) != name}
    figures.update({k: float(v) for k, v in result.figures.items()})
    labels = {k: v for k, v in previous.get("labels", {}).items() if owner(k) != name} | result.labels
    runs = dict(previous.get("runs", {}))
    runs[name] = {**run, "rows": result.rows, "plots": result.plots, "notes": result.notes}
    return {"figures": dict(sorted(figures.items())), **({"labels": dict(sorted(labels.items()))} if labels else {}),
            "runs": dict(sorted(runs.items()))}


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _md_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return out


def _goal_cell(bench: Bench | None, key: str, value: float) -> str:
    goal = next((g for g in bench.goals if g.key == key), None) if bench else None
    if goal is None:
        return ""
    return f"{goal} ({'met' if goal.met(value) else 'NOT met'})"


OTHER_WRITERS: dict[str, tuple[str, str]] = {
    "reliability": ("Reliability drills", "Written by `rollstream drills` (`make drills`); how each figure is measured is in RELIABILITY.md."),
}
"""Key prefixes in ``bench/results.json`` that another command writes: listed with a pointer, not as stale."""


def render_markdown(results: Mapping[str, Any], benches: Mapping[str, Bench]) -> str:
    """``BENCHMARKS.md`` from the results record and the registrations (pure)."""
    figures: dict[str, float] = results.get("figures", {})
    labels: dict[str, str] = results.get("labels", {})
    runs: dict[str, dict] = results.get("runs", {})
    out = ["# Benchmarks", "",
           "Generated by `rollstream bench` (`make bench`) from `bench/results.json`; do not edit by hand. "
           "Each section shows the latest run of that benchmark. Ratios compare the pipeline with a baseline "
           "measured in the same run on the same machine.", ""]
    goal_rows = [{"figure": f"`{g.key}`", "value": figures[g.key], "goal": _goal_cell(b, g.key, figures[g.key]),
                  "why": g.why} for b in benches.values() for g in b.goals if g.key in figures]
    if goal_rows:
        out += ["## Goals", "", *_md_table(goal_rows), ""]
    owners = {k: key_owner(k, dict(benches)) for k in {**figures, **labels}}
    for name in sorted(set(runs) | set(owners.values())):
        bench = benches.get(name)
        run = runs.get(name, {})
        title, pointer = OTHER_WRITERS.get(name, ("(benchmark no longer registered)", ""))
        out += [f"## `{name}`: {bench.title if bench else title}", ""]
        out += [pointer, ""] if pointer and not bench else []
        if bench:
            out += [f"**What.** {bench.measures}", "", f"**How.** {bench.method}", ""]
        if run:
            m = run.get("machine", {})
            out += [f"**Last run.** {run.get('date', '?')}, {'quick' if run.get('quick') else 'full'} mode, "
                    f"{run.get('seconds', 0):.1f} s; {m.get('cpus', '?')} CPUs {m.get('machine', '')}, "
                    f"{m.get('memory_gb', '?')} GiB, load {m.get('load_1min', '?')}, Python {m.get('python', '?')}, "
                    f"pyarrow {m.get('pyarrow', '?')}.", ""]
            out += [*_md_table(run.get("rows", [])), ""] if run.get("rows") else []
        keys = sorted(k for k in owners if owners[k] == name)
        out += ["| figure | value | goal |", "|---|---|---|"]
        out += [f"| `{k}` | {labels[k]} | |" if k in labels else
                f"| `{k}` | {_fmt(figures[k])} | {_goal_cell(bench, k, figures[k])} |" for k in keys]
        out.append("")
        if run.get("notes"):
            out += [run["notes"], ""]
        out += [f"![{p}](bench/{p})" for p in run.get("plots", [])]
        if run.get("plots"):
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class BenchmarksFailed(Exception):  # noqa: N818 - the run's outcome, raised after every benchmark ran
    """Some benchmarks of a run failed. ``failures``: each one's error by name; ``figures``: what the run
    measured (the benchmarks that passed, and the parts of a ``PartialResult``), as ``run_benchmarks`` returns."""

    def __init__(self, failures: dict[str, Exception], figures: dict[str, float]) -> None:
        super().__init__(f"{len(failures)} benchmark(s) failed: "
                         + "; ".join(f"{name}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
                                     for name, err in failures.items()))
        self.failures = failures
        self.figures = figures


def run_benchmarks(names: Sequence[str] | None = None, quick: bool = False, out_dir: Path = Path("."), *,
                   seeds: Sequence[int] | None = None, arms: Sequence[str] | None = None, preset: str | None = None,
                   budget_s: float | None = None,
                   progress: Callable[[str], None] = _stderr,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Run the named benchmarks (all registered ones by default); returns the figures of this run, or raises
    ``BenchmarksFailed`` (carrying them) after the last benchmark when any failed. ``seeds``: the seeds the
    benchmarks that repeat over seeds run (None: each one's default); ``arms``: the arms the benchmarks made of arms
    run (None: all); ``preset``: the campaign preset the benchmarks that run the demo command start from."""
    benches = load_benches()
    names = list(names) if names else sorted(benches)
    unknown = [n for n in names if n not in benches]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; registered: {sorted(benches)}")
    out_dir = Path(out_dir)
    results_path, plot_dir = out_dir / RESULTS, out_dir / RESULTS.parent
    plot_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    figures: dict[str, float] = {}
    failures: dict[str, Exception] = {}
    for name in names:
        progress(f"bench {name} ({'quick' if quick else 'full'}) ...")
        scratch = Path(tempfile.mkdtemp(prefix=f"rollstream-bench-{name}-"))
        start = clock()
        try:
            result = benches[name].fn(BenchContext(quick=quick, plot_dir=plot_dir, scratch=scratch, progress=progress,
                                                    seeds=tuple(seeds) if seeds else None,
                                                    arms=tuple(arms) if arms else None, preset=preset,
                                                    budget_s=budget_s))
        except BenchSkipped as skipped:
            progress(f"bench {name} skipped, nothing recorded: {skipped}")
            continue
        except Exception as err:  # noqa: BLE001 - reported, and the other benchmarks still run
            progress(f"bench {name} FAILED after {clock() - start:.1f} s:\n"
                     + "".join(traceback.format_exception(err)).rstrip())
            failures[name] = err
            if not isinstance(err, PartialResult):
                continue
            result = err.result  # recorded below like a full result
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        seconds = clock() - start
        check_result(name, result, benches)
        run = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "quick": quick,
               "seconds": round(seconds, 2), "machine": machine_info()}
        # Re-read first: another process (the drills) may have written its figures since we started.
        results = json.loads(results_path.read_text()) if results_path.exists() else results
        results = merge_results(results, name, result, run, benches)
        figures.update(result.figures)
        # Saved after each benchmark: a later one failing does not lose this one's figures.
        _write_atomically(results_path, json.dumps(results, indent=2) + "\n")
        _write_atomically(out_dir / REPORT, render_markdown(results, benches))
        for doc in documents(out_dir):  # the figures blocks of the README and docs/ quote the record too
            text = doc.read_text()
            if rerender(text, results) != text:
                _write_atomically(doc, rerender(text, results))
        progress(f"bench {name}: {len(result.figures)} figures in {seconds:.1f} s")
    if failures:
        raise BenchmarksFailed(failures, figures)
    return figures
