"""The ``engine`` benchmark: its request mixes, the decode-step schedules of both modes on a skewed set
(derived by hand), and the registered benchmark end to end in a minimal mode."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import engine as engine_bench
from bench.engine_runs import LengthMix, TurnKind, measure_continuous_vs_static, mixed_requests
from bench.registry import BenchContext, load_benches
from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.config import EngineConfig


def test_agent_mix_holds_exactly_its_shares_with_lengths_in_each_kinds_range() -> None:
    requests = mixed_requests(96, LengthMix.agent(), vocab_size=512, seed=0)
    budgets = [s.max_new_tokens for _, s in requests]
    short = [b for b in budgets if 10 <= b <= 30]
    long = [b for b in budgets if 150 <= b <= 200]
    assert (len(short), len(long)) == (72, 24)  # 3/4 and 1/4 of 96, nothing outside the two ranges
    assert all(4 <= len(p) <= 48 and all(1 <= t < 512 for t in p) for p, _ in requests)
    assert [s.seed for _, s in requests] == list(range(96))
    assert [i for i, b in enumerate(budgets) if b >= 150] != list(range(72, 96))  # kinds shuffled together
    assert mixed_requests(96, LengthMix.agent(), vocab_size=512, seed=0) == requests


def test_static_steps_factor_is_the_expected_longest_budget_over_the_mean() -> None:
    # Budgets 1 or 2, equally likely; 2 slots: the longest is 2 unless both are 1 (p = 1/4), so
    # E[longest] = 1 + 3/4 = 7/4; mean budget 3/2; factor 7/6.
    coin = LengthMix(turns=(TurnKind(name="any", share=1.0, new_tokens=(1, 2)),))
    assert coin.static_steps_factor(2) == pytest.approx(7 / 6)
    # All budgets equal: static loses nothing.
    fixed = LengthMix(turns=(TurnKind(name="any", share=1.0, new_tokens=(5, 5)),))
    assert fixed.static_steps_factor(8) == pytest.approx(1.0)
    # Uniform on 4..96, 8 slots: E[longest] ≈ 4 + 92 * 8/9 ≈ 85.8 over mean 50 ≈ 1.72 (below 2: why the
    # headline uses the agent mix).
    assert LengthMix.uniform().static_steps_factor(8) == pytest.approx(1.72, abs=0.01)
    assert LengthMix.agent().static_steps_factor(8) > 2.5


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: LengthMix(turns=(TurnKind(name="a", share=0.5, new_tokens=(1, 2)),)), "sum to 1, got 0.5"),
        (lambda: TurnKind(name="a", share=1.0, new_tokens=(9, 3)), "(9, 3)"),
        (lambda: LengthMix(prompt_lens=(0, 4), turns=(TurnKind(name="a", share=1.0, new_tokens=(1, 2)),)),
         "(0, 4)"),
    ],
)
def test_length_mix_rejects_bad_settings_naming_the_value(make, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        make()


@pytest.mark.slow  # about a minute; the engine benchmark (make bench --only engine) measures the same step counts
def test_one_long_turn_in_four_makes_static_decode_twice_as_many_steps_as_continuous() -> None:
    """4 slots, 12 requests with budgets [32, 4, 4, 4] x 3 in this order (one answer per three tool calls).

    A request of budget m decodes for exactly m steps (no stop ids). Static: three batches of four, each
    lasting its longest budget: 3 x 32 = 96 steps.
    Continuous (FIFO into free slots), a freed slot refilled at the next step, by step: 0: r0(32) r1 r2
    r3(4); 4: r4(32) r5 r6(4); 8: r7(4) r8(32); 12: r9; 16: r10; 20: r11; r8 ends last at 8 + 32 = 40.
    So static needs 96 / 40 = 2.4 decode steps per continuous step. (A freed slot idling one step before
    its next request, as a pipelined engine that frees slots only when it collects their last token
    does, would give 42: r8 admitted at 10.)
    """
    budgets = [32, 4, 4, 4] * 3
    requests = [(list(range(1, 9)), SamplingParams(max_new_tokens=m, seed=i)) for i, m in enumerate(budgets)]
    f = measure_continuous_vs_static({"skewed": requests}, engine_config=EngineConfig.tiny(), repeats=1)["skewed"]
    assert (f["continuous_decode_steps"], f["static_decode_steps"]) == (40, 96)
    assert f["static_over_continuous_steps"] == pytest.approx(2.4)
    assert f["generated_tokens"] == sum(budgets)
    assert "ceiling_tokens_per_s" not in f


def test_measure_rejects_a_request_that_would_stop_at_the_context_limit() -> None:
    requests = [([1] * 100, SamplingParams(max_new_tokens=29))]  # 129 > EngineConfig.tiny().max_seq_len = 128
    with pytest.raises(ValueError, match="set 'long', request 0: prompt 100 \\+ max_new_tokens 29 exceeds"):
        measure_continuous_vs_static({"long": requests}, engine_config=EngineConfig.tiny(), repeats=1)


def test_measure_rejects_a_ceiling_of_an_unknown_set_naming_the_sets() -> None:
    requests = [([1] * 4, SamplingParams(max_new_tokens=2))]
    with pytest.raises(ValueError, match=r"ceiling_of='agnet'.*\['agent'\]"):
        measure_continuous_vs_static({"agent": requests}, repeats=1, ceiling_of="agnet")


@pytest.mark.slow  # compiles the engine's shapes (about 25 s); make bench --only engine runs the same wiring at size
def test_engine_bench_reports_both_mixes_and_the_ceiling(monkeypatch, tmp_path: Path) -> None:
    # The wiring, at the shapes of EngineConfig.tiny() (compiled once per process, shared with the test
    # above) and short budgets, so it runs in seconds; the real sizes are the benchmark's business.
    monkeypatch.setattr(engine_bench, "QUICK", {"n_requests": 8, "repeats": 1})
    monkeypatch.setattr(engine_bench, "ENGINE", EngineConfig.tiny())
    monkeypatch.setattr(engine_bench, "AGENT", LengthMix(prompt_lens=(4, 16), turns=(
        TurnKind(name="tool call", share=0.75, new_tokens=(2, 4)), TurnKind(name="answer", share=0.25,
                                                                            new_tokens=(20, 30)))))
    monkeypatch.setattr(engine_bench, "UNIFORM", LengthMix(prompt_lens=(4, 16), turns=(
        TurnKind(name="any", share=1.0, new_tokens=(2, 30)),)))
    result = load_benches()["engine"].fn(BenchContext(quick=True, plot_dir=tmp_path, scratch=tmp_path,
                                                      progress=lambda line: None))
    f = result.figures
    assert f["engine.n_requests"] == 8 and f["engine.num_slots"] == engine_bench.ENGINE.num_slots
    for prefix in ("engine.", "engine.uniform_"):
        ratio = f[f"{prefix}continuous_over_static"]
        assert math.isfinite(ratio) and ratio > 0
        # Timing-free: static never needs fewer decode steps than continuous on the same requests.
        assert f[f"{prefix}static_over_continuous_steps"] >= 1.0
    assert f["engine.ceiling_tokens_per_s"] > 0
    # The ceiling decodes whole waves with every slot busy, at least as many tokens as the agent set.
    assert f["engine.ceiling_decode_steps"] * engine_bench.ENGINE.num_slots >= f["engine.generated_tokens"]
    assert [(r["mix"], r["run"]) for r in result.rows] == [
        ("agent", "continuous"), ("agent", "static"), ("agent", "ceiling (all slots full)"),
        ("uniform", "continuous"), ("uniform", "static")]
    assert (tmp_path / result.plots[0]).stat().st_size > 0


@pytest.mark.parametrize("name", ["engine", "rollout", "trainer", "publish"])
def test_benchmark_is_registered_with_goals_on_its_own_keys(name: str) -> None:
    bench = load_benches()[name]
    assert bench.goals and all(g.key.startswith(f"{name}.") for g in bench.goals)
