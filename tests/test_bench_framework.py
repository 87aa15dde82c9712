"""Benchmark framework: registry, results merge, BENCHMARKS.md regeneration, and the quick ``store`` benchmark."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import registry
from bench.registry import (
    Bench,
    BenchContext,
    BenchResult,
    BenchSkipped,
    Goal,
    PartialResult,
    load_benches,
    register_bench,
)
from bench.runner import BenchmarksFailed, render_markdown, run_benchmarks
from harness.results import merge_results
from pipelines_lib import cli


def _toy(figures: dict[str, float]) -> Bench:
    def fn(ctx: BenchContext) -> BenchResult:
        (ctx.plot_dir / "toy.png").write_bytes(b"png")
        return BenchResult(figures=figures, rows=[{"variant": "a", "MB/s": 2.5}, {"variant": "b", "MB/s": 5.0}],
                           plots=["toy.png"], notes=f"quick={ctx.quick}")
    return Bench(name="toy", title="Toy", measures="nothing real", method="returns constants",
                 goals=(Goal(key="toy.ratio", op=">=", value=0.9, why="close to raw"),), fn=fn)


@pytest.fixture
def toy(monkeypatch) -> None:
    load_benches()
    monkeypatch.setitem(registry.BENCHES, "toy", _toy({"toy.ratio": 0.5, "toy.mb_s": 2.5}))


def test_a_run_replaces_its_own_figures_and_keeps_other_benchmarks(toy, tmp_path: Path) -> None:
    results_path = tmp_path / "bench" / "results.json"
    results_path.parent.mkdir()
    results_path.write_text(json.dumps({
        "figures": {"other.speed": 7.0, "toy.renamed_away": 1.0},
        "runs": {"other": {"date": "2026-01-01", "quick": False, "rows": [], "plots": [], "notes": ""}}}))
    figures = run_benchmarks(names=["toy"], quick=True, out_dir=tmp_path, progress=lambda line: None)
    assert figures == {"toy.ratio": 0.5, "toy.mb_s": 2.5}
    saved = json.loads(results_path.read_text())
    assert saved["figures"] == {"other.speed": 7.0, "toy.mb_s": 2.5, "toy.ratio": 0.5}
    assert saved["runs"]["other"]["date"] == "2026-01-01"
    toy_run = saved["runs"]["toy"]
    assert toy_run["quick"] is True and toy_run["plots"] == ["toy.png"] and toy_run["machine"]["cpus"] >= 1
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## `toy`: Toy" in md and "## `other`: (benchmark no longer registered)" in md
    assert "| `toy.ratio` | 0.5 | ≥ 0.9 (NOT met) |" in md
    assert "| a | 2.5 |" in md and "![toy.png](bench/toy.png)" in md and "quick=True" in md


def test_markdown_is_regenerated_from_results_alone() -> None:
    bench = _toy({})
    results = {"figures": {"toy.ratio": 0.95}, "runs": {}}
    md = render_markdown(results, {"toy": bench})
    assert "| `toy.ratio` | 0.95 | ≥ 0.9 (met) | close to raw |" in md  # the goals summary
    assert "**What.** nothing real" in md and "**How.** returns constants" in md


def test_a_figure_with_a_floor_and_a_ceiling_shows_both_goals_judged() -> None:
    band = Bench(name="toy", title="Toy", measures="m", method="h", fn=lambda ctx: BenchResult(),
                 goals=(Goal(key="toy.pts", op=">=", value=50.0, why="learns"),
                        Goal(key="toy.pts", op="<=", value=90.0, why="does not saturate")))
    md = render_markdown({"figures": {"toy.pts": 95.0}, "runs": {}}, {"toy": band})
    assert "| `toy.pts` | 95 | ≥ 50 (met) | learns |" in md  # the goals summary: one row per goal
    assert "| `toy.pts` | 95 | ≤ 90 (NOT met) | does not saturate |" in md
    assert "| `toy.pts` | 95 | ≥ 50 (met); ≤ 90 (NOT met) |" in md  # the benchmark's own table: both sides


def test_merge_is_pure_and_drops_stale_keys_of_the_benchmark_that_ran() -> None:
    previous = {"figures": {"a.x": 1.0, "b.y": 2.0}, "runs": {}}
    merged = merge_results(previous, "a", {"quick": True}, figures={"a.z": 3.0})
    assert merged["figures"] == {"a.z": 3.0, "b.y": 2.0}
    assert previous["figures"] == {"a.x": 1.0, "b.y": 2.0}


def test_unknown_benchmark_names_list_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown benchmark\(s\) \['nope'\]; registered: \[.*'store'"):
        run_benchmarks(names=["nope"], out_dir=tmp_path)


def test_figures_must_carry_the_benchmark_prefix(monkeypatch, tmp_path: Path) -> None:
    load_benches()
    monkeypatch.setitem(registry.BENCHES, "toy", _toy({"ratio": 1.0}))
    with pytest.raises(ValueError, match="figure 'ratio': keys must start with 'toy.'"):
        run_benchmarks(names=["toy"], out_dir=tmp_path, progress=lambda line: None)


def test_a_partial_result_is_recorded_and_the_run_fails_naming_it(monkeypatch, tmp_path: Path) -> None:
    def fn(ctx: BenchContext) -> BenchResult:
        try:
            raise RuntimeError("part two ran out of memory")
        except RuntimeError as err:
            raise PartialResult(BenchResult(figures={"toy.ratio": 0.95}, notes="part two failed"), "part two") from err

    load_benches()
    monkeypatch.setitem(registry.BENCHES, "toy", Bench(name="toy", title="Toy", measures="", method="", goals=(), fn=fn))
    with pytest.raises(BenchmarksFailed, match="1 benchmark.* failed: toy: part two") as raised:
        run_benchmarks(names=["toy"], out_dir=tmp_path, progress=lambda line: None)
    assert "out of memory" in str(raised.value.failures["toy"].__cause__)
    assert raised.value.figures == {"toy.ratio": 0.95}
    saved = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert saved["figures"] == {"toy.ratio": 0.95} and saved["runs"]["toy"]["notes"] == "part two failed"
    assert "part two failed" in (tmp_path / "BENCHMARKS.md").read_text()


def test_a_failing_benchmark_does_not_stop_the_next_and_the_command_exits_1(monkeypatch, tmp_path: Path,
                                                                              capsys) -> None:
    def broken(ctx: BenchContext) -> BenchResult:
        raise RuntimeError("campaign /x failed (exit 1, its trainer did not finish)")

    load_benches()
    monkeypatch.setitem(registry.BENCHES, "broken", Bench(name="broken", title="Broken", measures="", method="",
                                                         goals=(), fn=broken))
    monkeypatch.setitem(registry.BENCHES, "toy", _toy({"toy.ratio": 0.5}))
    lines: list[str] = []
    with pytest.raises(BenchmarksFailed) as raised:
        run_benchmarks(names=["broken", "toy"], out_dir=tmp_path, progress=lines.append)
    assert list(raised.value.failures) == ["broken"] and raised.value.figures == {"toy.ratio": 0.5}
    assert any(line.startswith("bench broken FAILED") and "Traceback" in line for line in lines)
    assert json.loads((tmp_path / "bench" / "results.json").read_text())["figures"] == {"toy.ratio": 0.5}

    assert cli.main(["bench", "--only", "broken", "--only", "toy", "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "toy.ratio = 0.5\n"
    assert "rollstream bench: 1 benchmark(s) failed: broken: campaign /x failed (exit 1" in err


def test_registration_checks_names_and_goal_keys() -> None:
    with pytest.raises(ValueError, match="goal key 'other.x' must start with one of \\['x.'\\]"):
        register_bench("x", title="", measures="", method="", goals=(Goal(key="other.x", op=">=", value=1),))
    with pytest.raises(ValueError, match="registered twice"):
        register_bench("store", title="", measures="", method="")(lambda ctx: BenchResult(figures={}))
    assert "store" in load_benches()  # registered by a module listed in BENCH_MODULES


def test_store_benchmark_quick_via_the_cli(tmp_path: Path, capsys) -> None:
    assert cli.main(["bench", "--quick", "--only", "store", "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "bench" / "results.json").read_text())["figures"]
    assert figures["store.write_over_pyarrow"] > 0 and figures["store.read_over_pyarrow"] > 0
    assert figures["store.shard_mb"] < figures["store.table_mb"]  # zstd shrinks token lists
    assert (tmp_path / "bench" / "store_throughput.png").stat().st_size > 1000
    assert "store.read_over_pyarrow = " in capsys.readouterr().out


def test_a_registered_prefix_owns_its_keys_over_the_benchmark_named_by_their_first_part() -> None:
    from bench.registry import Bench, key_owner

    benches = {n: Bench(name=n, title="", measures="", method="", goals=(), fn=lambda ctx: None, prefixes=p)
               for n, p in (("engine", ()), ("vllm", ("engine.vllm.", "engine.jax_over_vllm.")))}
    assert key_owner("engine.vllm.traj_per_hour.none", benches) == "vllm"
    assert key_owner("engine.jax_over_vllm.none", benches) == "vllm"
    assert key_owner("engine.continuous_over_ceiling", benches) == "engine"
    assert key_owner("reliability.kills", benches) == "reliability"


def test_text_labels_are_merged_by_owner_and_shown_beside_the_figures() -> None:
    previous = {"figures": {"a.x": 1.0}, "labels": {"a.device": "old chip", "b.device": "TPU v4"}, "runs": {}}
    merged = merge_results(previous, "a", {"quick": False}, figures={"a.x": 2.0}, labels={"a.device": "TPU v5 lite"})
    assert merged["labels"] == {"a.device": "TPU v5 lite", "b.device": "TPU v4"}
    md = render_markdown(merged, {"toy": _toy({})})
    assert "| `a.device` | TPU v5 lite | |" in md and "| `a.x` | 2 |" in md


def test_a_skipped_benchmark_records_nothing_and_a_group_name_runs_its_members(monkeypatch, tmp_path: Path,
                                                                              capsys) -> None:
    def skipped(ctx: BenchContext) -> BenchResult:
        raise BenchSkipped("no accelerator here")

    load_benches()
    for name in ("grp_one", "grp_two"):
        monkeypatch.setitem(registry.BENCHES, name, Bench(name=name, title=name, measures="", method="", goals=(),
                                                          fn=skipped))
    assert cli.main(["bench", "--only", "grp", "--out", str(tmp_path)]) == 0
    _, err = capsys.readouterr()
    assert err.count("skipped, nothing recorded: no accelerator here") == 2
    # Each progress line is led by the time it was said (HH:MM:SS, UTC).
    assert err.splitlines() and all(re.match(r"\d\d:\d\d:\d\d \S", line) for line in err.splitlines())
    assert not (tmp_path / "bench" / "results.json").exists()


def test_a_budget_is_the_whole_runs_each_benchmark_gets_what_the_ones_before_it_left(monkeypatch,
                                                                                      tmp_path: Path) -> None:
    now = [0.0]
    budgets: list[float | None] = []

    def spends(seconds: float) -> Bench:
        def fn(ctx: BenchContext) -> BenchResult:
            budgets.append(ctx.budget_s)
            now[0] += seconds
            return BenchResult(figures={})
        return Bench(name="x", title="x", measures="", method="", goals=(), fn=fn)

    monkeypatch.setitem(registry.BENCHES, "first", spends(100.0))
    monkeypatch.setitem(registry.BENCHES, "second", spends(500.0))
    monkeypatch.setitem(registry.BENCHES, "third", spends(1.0))
    run_benchmarks(["first", "second", "third"], out_dir=tmp_path, budget_s=540, clock=lambda: now[0],
                   progress=lambda line: None)
    assert budgets == [540.0, 440.0, 0.0]  # the third finds nothing left, not a fresh 540 s
