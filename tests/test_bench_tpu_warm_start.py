"""The warm-start sweep's bookkeeping (resume per candidate, a changed candidate starts afresh, the budget) with a
stand-in measurement, and its quick form run for real on the CPU (warm start and v0 evaluation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import bench.tpu_warm_start as sweep
from bench.registry import BenchContext


def context(tmp_path: Path, **kw: Any) -> BenchContext:
    (tmp_path / "scratch").mkdir(exist_ok=True)
    return BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path / "scratch", progress=lambda line: None, **kw)


@pytest.fixture()
def measured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """``measure`` replaced by a record of (candidate folder, seed) and a v0 of 10 x seed points."""
    calls: list[tuple[str, int]] = []

    def fake(scratch: Path, config: Any, log: Any) -> dict[str, float]:
        calls.append((scratch.parent.name, config.seed))
        return {"v0_greedy": 0.1 * config.seed, "v0_sampled": 0.05, "warm_start_s": 1.0, "eval_s": 1.0}

    monkeypatch.setattr(sweep, "measure", fake)
    return calls


def test_the_sweep_resumes_per_candidate_and_restarts_a_candidate_whose_config_changed(
        tmp_path: Path, measured: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "ledger.json"
    result = sweep.run(context(tmp_path, seeds=(0, 1, 2)), device="cpu", ledger_path=ledger)
    assert measured == [(c, s) for c in sweep.QUICK_CANDIDATES for s in (0, 1, 2)]
    # v0 of 0, 10 and 20 points: mean 10, spread 20.
    assert result.figures["tpu.warm_start.both_flaws.v0_pts"] == 10.0
    assert result.figures["tpu.warm_start.both_flaws.v0_pts_spread"] == 20.0
    measured.clear()
    sweep.run(context(tmp_path, seeds=(0, 1, 2, 3)), device="cpu", ledger_path=ledger)
    assert measured == [(c, 3) for c in sweep.QUICK_CANDIDATES]  # only the new seed
    measured.clear()
    monkeypatch.setitem(sweep.CANDIDATES, "error_75", {"sft.error_rate": 0.7})
    again = sweep.run(context(tmp_path, seeds=(0,)), device="cpu", ledger_path=ledger)
    assert measured == [("error_75", 0)]  # the changed candidate starts afresh, the other keeps its runs
    assert again.figures["tpu.warm_start.error_75.seeds"] == 1.0 and again.figures["tpu.warm_start.both_flaws.seeds"] == 4
    assert json.loads(ledger.read_text())["device"] == "cpu"


def test_a_candidate_wanting_more_demonstrations_than_tasks_is_refused_before_anything_runs(
        tmp_path: Path, measured: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    # twostep's one-digit operands make about 2,400 distinct train tasks: 4096 demonstrations cannot be drawn.
    monkeypatch.setitem(sweep.CANDIDATES, "error_75", {"sft.n_demos": 4096})
    with pytest.raises(ValueError, match=r"candidate 'error_75' \(\{\"sft.n_demos\": 4096\}\): twostep: found only "
                                         r"\d+ distinct train tasks of 4096"):
        sweep.run(context(tmp_path, seeds=(0,)), device="cpu", ledger_path=tmp_path / "l.json")
    assert measured == [] and not (tmp_path / "l.json").exists()


def test_every_candidate_can_make_its_warm_start() -> None:
    sweep.check_candidates(tuple(sweep.CANDIDATES), quick=False)


def test_a_budget_spent_leaves_the_rest_for_a_later_command(tmp_path: Path, measured: list[tuple[str, int]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 10))  # each measurement takes 10 s of the stand-in clock
    monkeypatch.setattr(sweep.time, "monotonic", lambda: float(next(clock)))
    result = sweep.run(context(tmp_path, seeds=(0, 1, 2), budget_s=45), device="cpu", ledger_path=tmp_path / "l.json")
    # Started at 0; seed 0 checked at 10 (35 s left), measured from 20 to 30; seed 1 checked at 40: 5 s left is
    # less than 1.1 x the 10 s it took, and so for every later one.
    assert measured == [("both_flaws", 0)]
    assert "Left for a later command (budget): both_flaws seed 1, both_flaws seed 2, error_75 seed 0" in result.notes


def test_the_quick_sweep_warm_starts_and_scores_v0_for_real_on_the_cpu(tmp_path: Path) -> None:
    result = sweep.run(context(tmp_path), device="cpu", ledger_path=tmp_path / "ledger.json")
    runs = json.loads((tmp_path / "ledger.json").read_text())["candidates"]
    assert sorted(runs) == sorted(sweep.QUICK_CANDIDATES)
    for entry in runs.values():
        figures = entry["runs"]["0"]
        assert 0.0 <= figures["v0_greedy"] <= 1.0 and 0.0 <= figures["v0_sampled"] <= 1.0
        assert figures["warm_start_s"] > 0
    assert result.figures["tpu.warm_start.both_flaws.seeds"] == 1.0
