"""``rollstream drills``: figures merged into bench/results.json, RELIABILITY.md only from a full drill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines_lib.drills import runner


def _fake(figures: dict[str, float]) -> runner.DrillFn:
    def fn(sizes: runner.DrillSizes, scratch: Path, progress: Any) -> tuple[dict[str, float], dict[str, Any]]:
        assert scratch.is_dir()
        return figures, {"sizes_seen": sizes.fuzz_examples}
    return fn


@pytest.fixture
def fake_drills(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "DRILLS", {
        "fuzz": _fake({"reliability.fuzz_cases": 2500.0, "reliability.fuzz_crashes": 0.0}),
        "secrets": _fake({"reliability.secret_leaks": 0.0})})


def test_quick_run_merges_figures_and_keeps_other_benchmarks(tmp_path: Path, fake_drills: None) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps({"figures": {"store.read_mb_s": 100.0},
                                                                 "runs": {"store": {"quick": False}}}))
    figures = runner.run_drills(quick=True, out_dir=tmp_path, progress=lambda s: None)
    assert figures == {"reliability.fuzz_cases": 2500.0, "reliability.fuzz_crashes": 0.0,
                       "reliability.secret_leaks": 0.0}
    saved = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert saved["figures"]["store.read_mb_s"] == 100.0
    assert saved["figures"]["reliability.secret_leaks"] == 0.0
    assert saved["runs"]["reliability"]["quick"] is True
    assert not (tmp_path / "RELIABILITY.md").exists()  # the report shows the last full drill only


def test_full_run_writes_the_report_with_each_figure_and_its_method(tmp_path: Path, fake_drills: None) -> None:
    runner.run_drills(quick=False, out_dir=tmp_path, progress=lambda s: None)
    report = (tmp_path / "RELIABILITY.md").read_text()
    assert "| `reliability.fuzz_cases` | 2500 | Hypothesis cases over 5 entry points (500 each)" in report
    assert "| `reliability.secret_leaks` | 0 |" in report
    assert json.loads((tmp_path / "bench" / "reliability.json").read_text())["details"]["fuzz"]["sizes_seen"] == 500


def test_an_unknown_drill_is_refused_naming_the_choices(fake_drills: None) -> None:
    with pytest.raises(ValueError, match=r"unknown drill\(s\) \['nope'\]; choose from \['fuzz', 'secrets'\]"):
        runner.run_drills(only=["nope"])


def test_the_drills_subcommand_is_registered_on_the_cli() -> None:
    import pipelines_lib.drills.cli  # noqa: F401 - registers the subcommand
    from pipelines_lib.cli import SUBCOMMANDS, build_parser

    assert "drills" in SUBCOMMANDS
    args = build_parser().parse_args(["drills", "--quick", "--only", "fuzz"])
    assert args.quick and args.only == ["fuzz"]
