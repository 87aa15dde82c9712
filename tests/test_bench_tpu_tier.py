"""The tier's record: a real pytest JUnit report (a subprocess run of four small tests) read into counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.registry import BenchContext, BenchSkipped
from bench.tpu_tier import REPORT, bench_tpu_tier, tier_figures

TESTS = '''
import pytest

def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="not here")
def test_skips():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("setup broke")

def test_errors(broken):
    pass
'''


def test_a_junit_report_becomes_counts_with_the_chip_and_the_failing_tests(tmp_path: Path) -> None:
    (tmp_path / "test_four.py").write_text(TESTS)
    report = tmp_path / "bench" / "tpu_tier.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_four.py"), f"--junitxml={report}", "-o", "junit_suite_name=TPU v5 lite",
                           "--rootdir", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    result = tier_figures(report)
    assert result.figures == {"tpu.tier.passed": 1.0, "tpu.tier.failed": 2.0, "tpu.tier.skipped": 1.0,
                              "tpu.tier.tests": 4.0}
    assert result.labels == {"tpu.tier.device": "TPU v5 lite"}
    assert [(r["test"].rsplit("::", 1)[1], r["outcome"]) for r in result.rows] == [("test_fails", "failure"),
                                                                                  ("test_errors", "error")]
    assert "one is not two" in result.rows[0]["message"]
    # The benchmark reads the report beside the results it writes, and says how to make one when there is none.
    ctx = BenchContext(quick=False, plot_dir=tmp_path / "bench", scratch=tmp_path, progress=lambda _: None)
    assert tmp_path / REPORT == report and bench_tpu_tier(ctx).figures == result.figures
    report.unlink()
    with pytest.raises(BenchSkipped, match="run `make test-tpu` on an accelerator machine"):
        bench_tpu_tier(ctx)


def test_a_file_that_is_not_a_junit_report_is_named_in_the_error(tmp_path: Path) -> None:
    report = tmp_path / "tpu_tier.xml"
    report.write_text("<coverage/>")
    with pytest.raises(ValueError, match="tpu_tier.xml: no <testsuite> element; not a pytest JUnit report"):
        tier_figures(report)
