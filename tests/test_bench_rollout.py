"""The ``rollout`` benchmark in a minimal mode: every arm runs, every episode waits on one real tool call
(the calculator behind a latency profile, or the sandboxed Python tool in a real subprocess)."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path

import pytest

from bench import rollout as rollout_bench
from bench.registry import BenchContext, load_benches
from pipelines_lib.envs import make_env


@pytest.mark.slow  # about a minute; the rollout benchmark itself (make bench --only rollout) runs the same arms
def test_rollout_bench_reports_async_over_sync_busy_and_ceiling_per_profile(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rollout_bench, "QUICK", {"repeats": 1, "skip": 0, "async_n": 16,
                                                      "sync_batches": {"none": 1, "light": 1, "heavy": 1, "code": 1}})
    monkeypatch.setattr(rollout_bench, "ASYNC_CONCURRENCY", 32)  # a short ramp-up for a one-batch window
    monkeypatch.setattr(rollout_bench, "CALL_OVERHEAD_N", {"quick": 2, "full": 2})
    monkeypatch.setattr(rollout_bench, "PROFILES", {
        "none": rollout_bench.PROFILES["none"], "light": rollout_bench.PROFILES["light"],
        # Heavy's 5 s tail would make the test slow; a short log-normal exercises the same path.
        "heavy": rollout_bench.LatencyProfile.lognormal(0.02, 1.0, 0.1)})
    result = load_benches()["rollout"].fn(BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path,
                                                       progress=lambda line: None))
    f = result.figures
    for profile in ("none", "light", "heavy", "code"):
        for key in ("async_over_sync", "async_over_ceiling"):
            value = f[f"rollout.{profile}.{key}"]
            assert math.isfinite(value) and value > 0, (profile, key, value)
        assert 0 < f[f"rollout.{profile}.async_busy_fraction"] <= 1.0
    assert f["rollout.ceiling_traj_per_hour"] > 0
    assert all(f[f"rollout.code.call_ms_{arm}"] > 0 for arm in ("warm_pool", "cold_bwrap", "unisolated"))
    # The forced-call agent: exactly one tool call per episode in every arm, with the profile's delay.
    assert {r["tool calls/traj"] for r in result.rows} == {1.0}
    assert f["rollout.repeats"] == 1
    by_arm = {r["arm"]: r for r in result.rows}
    assert by_arm["light-sync"]["tool s"] >= 0.010 and by_arm["light-async"]["tool s"] >= 0.010  # U(10, 50) ms
    # A sandboxed run goes through a fresh sandbox (warm or not); a bare calculator call is far cheaper.
    assert by_arm["code-sync"]["tool s"] > 3 * by_arm["none-sync"]["tool s"]
    # The machine's CPU includes this process's (and, in the code arms, the sandboxes'); 2 cores at most here.
    for arm in ("code-async", "code-sync", "ceiling"):
        assert 0 < by_arm[arm]["CPU cores: process"] <= by_arm[arm]["CPU cores: machine"] * 1.05
        assert by_arm[arm]["CPU cores: machine"] <= os.cpu_count() * 1.05
    assert f["rollout.code.async_machine_cores"] == by_arm["code-async"]["CPU cores: machine"]
    assert len(result.rows) == 10 and (tmp_path / result.plots[0]).stat().st_size > 0


def test_forced_code_call_checks_the_reference_function_in_the_sandbox() -> None:
    task = rollout_bench.CodeEnv.generate_tasks(seed=0, n=1, split="train")[0]
    call = rollout_bench.forced_call(task)
    program = json.loads(call[call.index("{"):call.rindex("}") + 1])["arguments"]["code"]
    output = asyncio.run(make_env("code").tools()["python"]({"code": program}))
    assert output.strip() == "True"
