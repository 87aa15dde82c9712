"""The ``rollstream bench`` subcommand: its arguments (``add_arguments``) and what it runs (``run``).

Registered with the command line through the ``rollstream.commands`` entry-point group (``pyproject.toml``), so
it is there wherever the repository is installed; the library never imports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "run registered benchmarks; update bench/results.json and BENCHMARKS.md"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: seconds per benchmark")
    p.add_argument("--only", action="append", default=None, metavar="NAME", help="run only this benchmark (repeatable)")
    p.add_argument("--out", type=Path, default=Path("."), help="folder holding bench/ and BENCHMARKS.md")


def run(args: argparse.Namespace) -> int:
    from bench.runner import BenchmarksFailed, load_benches, run_benchmarks
    from pipelines_lib.cli import CommandError, did_you_mean

    registered = sorted(load_benches())
    for name in args.only or []:
        if name not in registered:
            raise CommandError(f"unknown benchmark {name!r}{did_you_mean(name, registered)}; "
                               f"registered: {', '.join(registered)}")

    try:
        figures, failed = run_benchmarks(names=args.only, quick=args.quick, out_dir=args.out,
                                         progress=lambda line: print(line, file=sys.stderr, flush=True)), None
    except BenchmarksFailed as err:
        figures, failed = err.figures, err
    for key, value in sorted(figures.items()):
        print(f"{key} = {value:.4g}")
    if failed is not None:
        print(f"rollstream bench: {failed} (tracebacks above)", file=sys.stderr)
        return 1
    return 0
