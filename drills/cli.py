"""The ``rollstream drills`` subcommand: its arguments (``add_arguments``) and what it runs (``run``).

Registered with the command line through the ``rollstream.commands`` entry-point group (``pyproject.toml``); the
library never imports it, and it does not import ``pipelines_lib.cli`` (under ``python -m pipelines_lib.cli`` that
module runs as ``__main__``, so an import from here would be a second copy of it). Exit code 1 when a figure shows a problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


HELP = ("reliability drills: fuzzing, sandbox escapes, secret leaks, storage faults, bounds, SIGKILLs, poisoned data, "
        "infrastructure faults, read bounds and checked replays, operator writes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes (1-2 minutes); RELIABILITY.md is left as is")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="run only this drill (repeatable): fuzz, sandbox, secrets, faults, bounds, kills, poison, infra, "
                        "readpath, writes")
    p.add_argument("--out", type=Path, default=Path("."), help="folder holding bench/ and RELIABILITY.md")


def run(args: argparse.Namespace) -> int:
    from drills.runner import run_drills
    from drills.storage_faults import FAULT_FAILURES

    figures = run_drills(quick=args.quick, out_dir=args.out, progress=_stderr, only=args.only)
    for key, value in sorted(figures.items()):
        print(f"{key} = {value:.4g}")
    bad = [k for k in ("reliability.fuzz_crashes", "reliability.sandbox_escapes", "reliability.secret_leaks",
                       "reliability.sandbox_caps_exceeded",
                       "reliability.lost_groups", "reliability.duplicated_groups", "reliability.partial_visible",
                       "reliability.hangs", "reliability.cli_tracebacks", "reliability.bounds_failed",
                       "reliability.trainer_poison_crashes", "reliability.pointer_regressions",
                       "reliability.infra_errors_in_gradient", "reliability.infra_groups_not_skipped",
                       "reliability.readpath_crashes", "reliability.nonfinite_publications",
                       "reliability.operator_overwrites", "reliability.operator_files_added",
                       "reliability.operator_write_failures")
           if figures.get(k, 0) > 0]
    bad += [k for k in FAULT_FAILURES if k in figures and figures[k] < 1]
    bad += [k for k in ("reliability.trainer_bit_identical", "reliability.evaluator_results_identical")
            if k in figures and figures[k] < 1]
    if figures.get("reliability.outage_stage_hung", 0) > 0:
        bad.append("reliability.outage_stage_hung")
    if bad:
        _stderr(f"rollstream drills: failed figures: {', '.join(bad)}")
    return 1 if bad else 0
