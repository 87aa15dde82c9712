"""The ``engine`` benchmark in a minimal mode: it runs end to end and returns sane figures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipelines_lib.bench import engine as engine_bench
from pipelines_lib.bench.registry import BenchContext, load_benches


def test_engine_bench_reports_the_continuous_over_static_ratio_and_the_ceiling(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine_bench, "QUICK", {"n_requests": 8, "repeats": 1})
    result = load_benches()["engine"].fn(BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path,
                                                      progress=lambda line: None))
    f = result.figures
    assert f["engine.n_requests"] == 8 and f["engine.num_slots"] == engine_bench.ENGINE.num_slots
    ratio = f["engine.continuous_over_static"]
    assert math.isfinite(ratio) and ratio > 0
    assert f["engine.ceiling_tokens_per_s"] > 0
    # Timing-free: static never needs fewer decode steps than continuous on the same requests.
    assert f["engine.static_over_continuous_steps"] >= 1.0
    assert [r["run"] for r in result.rows] == ["continuous", "static", "ceiling (all slots full)"]
    assert (tmp_path / result.plots[0]).stat().st_size > 0


@pytest.mark.parametrize("name", ["engine", "rollout", "trainer", "publish"])
def test_benchmark_is_registered_with_goals_on_its_own_keys(name: str) -> None:
    bench = load_benches()[name]
    assert bench.goals and all(g.key.startswith(f"{name}.") for g in bench.goals)
