"""The ``rollstream bench`` subcommand: its arguments (``add_arguments``) and what it runs (``run``).

Registered with the command line through the ``rollstream.commands`` entry-point group (``pyproject.toml``), so
it is there wherever the repository is installed; the library never imports it. ``python -m bench.cli`` is the
same command from a checkout that is not installed (an accelerator machine: ``make bench-tpu``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

HELP = "run registered benchmarks; update bench/results.json and BENCHMARKS.md"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: seconds per benchmark")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="run only this benchmark, or every benchmark named NAME_* (--only tpu), repeatable")
    p.add_argument("--seeds", type=seed_range, default=None, metavar="N|A..B",
                   help="seeds the benchmarks that repeat their campaign per seed run (learning, ablation, "
                        "tpu_ablation): N runs seeds 0..N-1, A..B seeds A to B inclusive (default: each one's own)")
    p.add_argument("--arms", default=None, metavar="A,B,...",
                   help="the arms the ablation (or tpu_ablation) runs, comma-separated (default: all; --quick: the "
                        "headline ones)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="seconds this whole run may take: tpu_ablation and tpu_warm_start start no run they do not "
                        "expect to finish within what the benchmarks before them left, and record what they have "
                        "(default: no limit)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="the campaign preset (a recipe in recipes/) the learning benchmark runs over its seeds (default: "
                        "make demo's, pipelines_lib.config.DEMO_PRESET; e.g. tiny)")
    p.add_argument("--out", type=Path, default=Path("."), help="folder holding bench/ and BENCHMARKS.md")


def seed_range(text: str) -> tuple[int, ...]:
    """``N`` -> seeds 0..N-1; ``A..B`` -> seeds A to B inclusive (argparse type: a bad value is a usage error)."""
    first, sep, last = text.partition("..")
    try:
        seeds = tuple(range(int(first), int(last) + 1)) if sep else tuple(range(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or A..B (whole numbers), got {text!r}") from None
    if not seeds or seeds[0] < 0:
        raise argparse.ArgumentTypeError(f"no seeds in {text!r}: N must be >= 1, A..B needs 0 <= A <= B")
    return seeds


def run(args: argparse.Namespace) -> int:
    from bench.runner import BenchmarksFailed, load_benches, run_benchmarks
    from pipelines_lib.cli import CommandError, did_you_mean

    if args.budget_s is not None and args.budget_s <= 0:
        raise CommandError(f"--budget-s must be > 0, got {args.budget_s:g}")
    registered = sorted(load_benches())
    names = None
    for name in args.only or []:
        group = [name] if name in registered else [b for b in registered if b.startswith(f"{name}_")]
        if not group:
            raise CommandError(f"unknown benchmark {name!r}{did_you_mean(name, registered)}; "
                               f"registered: {', '.join(registered)}")
        names = [*(names or []), *group]

    arms = [a.strip() for a in args.arms.split(",") if a.strip()] if args.arms else None
    if arms:
        from bench import ablation, tpu_ablation

        chosen = [m for m in (ablation, tpu_ablation) if names is None or m.NAME in names]
        if not chosen:
            raise CommandError("--arms chooses the arms of ablation or tpu_ablation; add --only with one of them")
        try:
            for module in chosen:
                module.chosen_arms(arms, quick=args.quick)
        except ValueError as err:
            raise CommandError(str(err)) from err
    if args.preset is not None:
        from pipelines_lib.config import CampaignConfig
        from pipelines_lib.configio import ConfigError

        if names is not None and "learning" not in names:
            raise CommandError("--preset chooses the learning benchmark's preset; add --only learning")
        try:
            CampaignConfig.preset(args.preset)  # the campaign command's own check of the name
        except ConfigError as err:
            raise CommandError(str(err)) from err
    try:
        figures, failed = run_benchmarks(names=names, quick=args.quick, out_dir=args.out, seeds=args.seeds, arms=arms,
                                         preset=args.preset, budget_s=args.budget_s,
                                         progress=stamped), None
    except BenchmarksFailed as err:
        figures, failed = err.figures, err
    for key, value in sorted(figures.items()):
        print(f"{key} = {value:.4g}")
    if failed is not None:
        print(f"rollstream bench: {failed} (tracebacks above)", file=sys.stderr)
        return 1
    return 0


def stamped(line: str) -> None:
    """A benchmark's progress line on stderr, led by the UTC time: a long run's log says when each part ran (a run
    stopped at a command's limit is read back from it)."""
    print(f"{dt.datetime.now(dt.UTC):%H:%M:%S} {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from pipelines_lib.cli import CommandError

    parser = argparse.ArgumentParser(prog="python -m bench.cli", description=HELP)
    add_arguments(parser)
    try:
        sys.exit(run(parser.parse_args()))
    except CommandError as e:
        sys.exit(f"bench: {e}")
