"""``rollstream drills``: figures merged into bench/results.json, RELIABILITY.md only from a full drill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from drills import kills as kills_mod
from drills import runner


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
    assert "| `reliability.fuzz_cases` | 2500 | Hypothesis cases over 6 entry points (500 each)" in report
    assert "| `reliability.secret_leaks` | 0 |" in report
    assert json.loads((tmp_path / "bench" / "reliability.json").read_text())["details"]["fuzz"]["sizes_seen"] == 500


def test_an_unknown_drill_is_refused_naming_the_choices(fake_drills: None) -> None:
    with pytest.raises(ValueError, match=r"unknown drill\(s\) \['nope'\]; choose from \['fuzz', 'secrets'\]"):
        runner.run_drills(only=["nope"])


def test_the_drills_subcommand_is_registered_on_the_cli() -> None:
    from pipelines_lib.cli import build_parser, commands

    assert "drills" in commands()  # through the rollstream.commands entry point
    args = build_parser().parse_args(["drills", "--quick", "--only", "fuzz"])
    assert args.quick and args.only == ["fuzz"]


def _trainer(kills: int, at_publish: bool, *, unloadable: int = 0) -> kills_mod.TrainerDrillResult:
    return kills_mod.TrainerDrillResult(
        kills=kills, at_publish=at_publish, starts=kills + 1, steps=36, groups_trained=72, trained_twice=0,
        bit_identical=True, partial_visible=0, orphans=0,
        landed=("save",) * kills if at_publish else ("outside",) * kills, unloadable=unloadable, leftovers_at_end=0,
        resume_gaps_s=(4.0, 6.0), seconds=1.0)


@pytest.fixture
def fake_kill_drills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """The four kill drills replaced by fixed results (the real ones run in test_drills_kills.py)."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def trainer(root: Path, **kw: Any) -> kills_mod.TrainerDrillResult:
        calls.append(("trainer", kw))
        # One publish-moment kill found a marked version that did not load: it must reach partial_visible.
        return _trainer(kw["kills"], kw.get("at_publish", False), unloadable=int(kw.get("at_publish", False)))

    def rollout(root: Path, **kw: Any) -> kills_mod.RolloutDrillResult:
        calls.append(("rollout", kw))
        return kills_mod.RolloutDrillResult(
            kills=kw["kills"], starts=kw["kills"] + 1, groups_committed=40, acknowledged_groups=30, lost=0,
            duplicated=0, partial_visible=0, orphans=2, resume_gaps_s=(3.0,), seconds=1.0)

    def evaluator(root: Path, **kw: Any) -> kills_mod.EvaluatorDrillResult:
        calls.append(("evaluator", kw))
        return kills_mod.EvaluatorDrillResult(
            kills=kw["kills"], starts=kw["kills"] + 1, version=1,
            eval_file_after_kill=("absent",) * (kw["kills"] - 1) + ("incomplete",), partial_visible=0, orphans=0,
            results_identical=True, greedy_identical=True, reference_s=2.0, recover_s=5.5, resume_gaps_s=(2.0, 3.0),
            seconds=1.0)

    monkeypatch.setattr(kills_mod, "trainer_kill_drill", trainer)
    monkeypatch.setattr(kills_mod, "rollout_kill_drill", rollout)
    monkeypatch.setattr(kills_mod, "evaluator_kill_drill", evaluator)
    monkeypatch.setattr(runner, "DRILLS", {"kills": runner.DRILLS["kills"]})
    return calls


def test_kill_figures_count_every_kill_and_the_report_describes_each_drill(
        tmp_path: Path, fake_kill_drills: list[tuple[str, dict[str, Any]]]) -> None:
    figures = runner.run_drills(quick=False, out_dir=tmp_path, progress=lambda s: None)
    assert [(name, kw["kills"], kw.get("at_publish", False)) for name, kw in fake_kill_drills] == [
        ("trainer", 10, False), ("trainer", 5, True), ("rollout", 20, False), ("evaluator", 5, False)]
    assert figures["reliability.kill_drills"] == 10 + 5 + 20 + 5
    assert (figures["reliability.publish_kills"], figures["reliability.evaluator_kills"]) == (5, 5)
    assert figures["reliability.publish_kills_mid_publish"] == 5
    # 1 unloadable version (publish drill) + 1 incomplete eval/v<N>.json after a kill
    assert figures["reliability.partial_visible"] == 2
    assert figures["reliability.evaluator_results_identical"] == 1.0
    assert figures["reliability.evaluator_recover_s"] == 5.5
    assert figures["reliability.resume_gap_s_evaluator_median"] == 2.5
    assert figures["reliability.resume_gap_s_publish_max"] == 6.0
    report = (tmp_path / "RELIABILITY.md").read_text()
    assert "| `reliability.kill_drills` | 40 | SIGKILLs delivered: trainer (10) + trainer while publishing (5) + " \
           "rollout worker (20) + evaluator (5)" in report
    assert "- Trainer, killed while publishing: 5 kills over 6 starts" in report
    assert "- Evaluator (v1): 5 kills over 6 starts" in report


def test_figures_that_several_drills_report_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Hangs and CLI tracebacks are counted by more than one drill over different cases: the report shows the total.
    monkeypatch.setattr(runner, "DRILLS", {
        "bounds": _fake({"reliability.hangs": 1.0, "reliability.cli_tracebacks": 0.0, "reliability.bounds_cases": 24.0}),
        "metadata": _fake({"reliability.hangs": 2.0, "reliability.cli_tracebacks": 3.0})})
    figures = runner.run_drills(quick=True, out_dir=tmp_path, progress=lambda s: None)
    assert figures == {"reliability.hangs": 3.0, "reliability.cli_tracebacks": 3.0, "reliability.bounds_cases": 24.0}


def test_a_full_rerun_of_one_drill_updates_its_part_of_the_report(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "DRILLS", {
        "fuzz": _fake({"reliability.fuzz_cases": 2500.0, "reliability.hangs": 1.0}),
        "bounds": _fake({"reliability.hangs": 2.0, "reliability.bounds_cases": 24.0})})
    runner.run_drills(quick=False, out_dir=tmp_path, progress=lambda s: None)
    monkeypatch.setattr(runner, "DRILLS", {"bounds": _fake({"reliability.hangs": 0.0, "reliability.bounds_cases": 25.0})})
    runner.run_drills(quick=False, out_dir=tmp_path, progress=lambda s: None, only=["bounds"])
    record = json.loads((tmp_path / "bench" / "reliability.json").read_text())
    assert record["figures"] == {"reliability.fuzz_cases": 2500.0, "reliability.hangs": 1.0,
                                 "reliability.bounds_cases": 25.0}  # fuzz's hang stays, bounds' are replaced
    assert record["details"]["fuzz"]["sizes_seen"] == 500 and [r["drills"] for r in record["reruns"]] == [["bounds"]]
    assert "**Rerun since.**" in (tmp_path / "RELIABILITY.md").read_text()
