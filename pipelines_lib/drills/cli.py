"""The ``rollstream drills`` subcommand, registered by importing this module.

``pipelines_lib.cli`` imports it after its own subcommands are defined (this module needs its ``subcommand``
decorator, so the import cannot sit at the top of ``cli.py``). Exit code 1 when a figure shows a problem.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipelines_lib.cli import subcommand


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _drills_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes (1-2 minutes); RELIABILITY.md is left as is")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="run only this drill (repeatable): fuzz, sandbox, secrets, faults, kills")
    p.add_argument("--out", type=Path, default=Path("."), help="folder holding bench/ and RELIABILITY.md")


@subcommand("drills", "reliability drills: fuzzing, sandbox escapes, secret leaks, storage faults, SIGKILLs",
            _drills_args)
def _drills(args: argparse.Namespace) -> int:
    # gcsfs's zonal-bucket probe stalls against the emulator the fault drill starts (README, GCS notes).
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    from pipelines_lib.drills.runner import run_drills
    from pipelines_lib.drills.storage_faults import FAULT_FAILURES

    figures = run_drills(quick=args.quick, out_dir=args.out, progress=_stderr, only=args.only)
    for key, value in sorted(figures.items()):
        print(f"{key} = {value:.4g}")
    bad = [k for k in ("reliability.fuzz_crashes", "reliability.sandbox_escapes", "reliability.secret_leaks",
                       "reliability.lost_groups", "reliability.duplicated_groups", "reliability.partial_visible")
           if figures.get(k, 0) > 0]
    bad += [k for k in FAULT_FAILURES if k in figures and figures[k] < 1]
    if figures.get("reliability.outage_stage_hung", 0) > 0:
        bad.append("reliability.outage_stage_hung")
    if bad:
        _stderr(f"rollstream drills: failed figures: {', '.join(bad)}")
    return 1 if bad else 0
