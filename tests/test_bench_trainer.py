"""The ``trainer`` and ``publish`` benchmarks in a minimal mode."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from bench import trainer as trainer_bench
from bench.registry import BenchContext, load_benches


def _ctx(tmp_path: Path) -> BenchContext:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return BenchContext(quick=True, plot_dir=tmp_path, scratch=scratch, progress=lambda line: None)


def test_trainer_bench_compares_streaming_with_bare_steps_on_the_same_batches(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(trainer_bench, "QUICK", {"repeats": 2, "steps": 1})  # both arm orders
    config = trainer_bench.bench_config()
    small = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, batch_groups=2))
    monkeypatch.setattr(trainer_bench, "bench_config", lambda: small)
    result = load_benches()["trainer"].fn(_ctx(tmp_path))
    f = result.figures
    assert f["trainer.steps_timed"] == 2
    assert math.isfinite(f["trainer.streaming_over_bare"]) and f["trainer.streaming_over_bare"] > 0
    assert f["trainer.streaming_tokens_per_s"] > 0 and f["trainer.bare_tokens_per_s"] > 0
    assert [r["arm"] for r in result.rows] == ["streaming trainer", "bare train_step"]


def test_publish_bench_measures_pickup_after_publication(tmp_path: Path) -> None:
    result = load_benches()["publish"].fn(_ctx(tmp_path))
    f = result.figures
    assert 0 < f["publish.pickup_latency_s"] < 30 and f["publish.save_s"] > 0 and f["publish.load_s"] > 0
    assert [r["version"] for r in result.rows] == [1, 2, 3]
