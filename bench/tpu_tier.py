"""Benchmark ``tpu_tier``: the chip's test tier, as last run on an accelerator, in figures.

```
make test-tpu          scripts/tpu_tests.sh: the tier in one process on the chip; run whole (no pytest arguments),
                       it writes pytest's JUnit report to bench/tpu_tier.xml, its suite named after the chip
rollstream bench --only tpu_tier
                       this module: the report's counts as tpu.tier.* figures, each failing test a row
```

Nothing runs here: the tier needs the chip and one process of its own, and a benchmark process would hold the chip
first. The report is committed like the ablation's ledgers, so the figures render on any machine; without a report
the benchmark says how to make one.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from bench.registry import BenchContext, BenchResult, BenchSkipped, Goal, register_bench

NAME = "tpu_tier"
REPORT = Path("bench/tpu_tier.xml")


def tier_figures(report: Path) -> BenchResult:
    """The counts of the JUnit report at ``report`` (pytest's ``--junitxml``): tests, passed, failed (failures and
    errors), skipped; the chip (the suite's name) as a label; one row per test that did not pass or skip."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{report}: no <testsuite> element; not a pytest JUnit report")
    rows = []
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for case in suite.iter("testcase"):
        bad = next((element for element in case if element.tag in ("failure", "error")), None)
        if bad is not None:
            counts["failed"] += 1
            message = (bad.get("message") or "").strip().splitlines()
            rows.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": bad.tag,
                         "message": message[0][:160] if message else ""})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    figures = {f"tpu.tier.{k}": float(v) for k, v in counts.items()} | {"tpu.tier.tests": float(sum(counts.values()))}
    device = suite.get("name", "unknown")
    notes = (f"The tier as run by scripts/tpu_tests.sh on {device} at {suite.get('timestamp', 'an unrecorded time')} "
             f"({float(suite.get('time', 'nan')):.0f} s); report {report}.")
    return BenchResult(figures=figures, rows=rows, notes=notes, labels={"tpu.tier.device": device})


@register_bench(
    NAME,
    title="The chip's test tier, as last run on an accelerator",
    measures="Tests of the chip's tier (kernels against XLA references, the model, the train step, the accelerator "
             "benchmarks, restores onto the chip) that passed, failed (failures and errors) and skipped on the chip.",
    method="`make test-tpu` (`scripts/tpu_tests.sh`) on an accelerator machine writes pytest's JUnit report to "
           "`bench/tpu_tier.xml` when the whole tier runs; this benchmark renders its counts and runs nothing.",
    goals=(Goal(key="tpu.tier.failed", op="<=", value=0.0, why="the tier green on the chip"),),
    prefixes=("tpu.tier.",),
)
def bench_tpu_tier(ctx: BenchContext) -> BenchResult:
    report = ctx.plot_dir.parent / REPORT
    if not report.exists():
        raise BenchSkipped(f"no {REPORT}: run `make test-tpu` on an accelerator machine, then this again")
    return tier_figures(report)
