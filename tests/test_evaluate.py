"""Evaluation: the pass@k estimator and the summary by hand, and the stage on a real (tiny, untrained) model
through the real engine, agent and env."""

from __future__ import annotations

import dataclasses
import re

import pytest
from flax import nnx

from pipelines_lib.agents import AgentConfig
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import DatasetConfig, prep
from pipelines_lib.engine import EngineConfig
from pipelines_lib.engine.backends import ENGINE_BACKENDS
from pipelines_lib.engine.config import ENGINE_KINDS
from pipelines_lib.evaluate import EvalConfig, pass_at_k, summarize
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import publish_weights
from pipelines_lib.records import EvalResult
from pipelines_lib.stages.evaluate import evaluate
from pipelines_lib.storage.layout import eval_path
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.record import Trajectory, Turn


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 2, 1 - 3 / 10),   # 1 - C(3,2)/C(5,2)
    (6, 2, 3, 1 - 4 / 20),   # 1 - C(4,3)/C(6,3)
    (4, 1, 1, 1 / 4),        # pass@1 = c / n
    (4, 0, 4, 0.0),
    (4, 1, 4, 1.0),          # n - c < k: every draw of k includes the correct one
    (5, 3, 3, 1.0),
])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="n=3, c=4"):
        pass_at_k(3, 4, 1)


def episode(reward: float, *, status: str = "ok", tool: bool = True, tool_error: str | None = None,
            assistant_turns: int = 2, parts: dict[str, float] | None = None) -> Trajectory:
    turns = [Turn(role="system", start=0, end=1), Turn(role="user", start=1, end=2)]
    for i in range(assistant_turns):
        turns.append(Turn(role="assistant", start=2 + 2 * i, end=3 + 2 * i))
        if tool and i == 0:
            turns.append(Turn(role="tool", start=3, end=4, tool_name="calculator", error=tool_error))
    n = turns[-1].end
    return Trajectory(group_id="g", prompt_id="p", sample_idx=0, group_size=1, worker_id="w", tokens=[0] * n,
                      loss_mask=[0] * n, logprobs=[0.0] * n, policy_version=[-1] * n, prompt_len=2, turns=turns,
                      reward=reward, status=status, reward_parts=parts or {})


def test_summary_counts_by_hand() -> None:
    greedy = [episode(1.0), episode(0.0, tool_error="parse_error"), episode(0.0, status="max_tokens", tool=False,
                                                                            assistant_turns=1)]
    sampled = [
        [episode(1.0), episode(1.0)],                       # both correct
        [episode(0.0), episode(1.0, status="max_turns")],   # a reward of 1 that did not end ok is no success
        [episode(1.0), episode(0.0, tool=False)],           # one of two
    ]
    out = summarize(greedy, sampled)
    assert (out["tasks"], out["k"]) == (3, 2)
    g = out["greedy"]
    assert g["success_rate"] == pytest.approx(1 / 3) == out["greedy_success_rate"]
    assert g["mean_reward"] == pytest.approx(1 / 3)
    assert g["avg_turns"] == pytest.approx((2 + 2 + 1) / 3)
    assert g["tool_use_rate"] == pytest.approx(2 / 3)
    assert g["statuses"] == {"max_tokens": 1, "ok": 2}
    assert g["failure_kinds"] == {"parse_error": 1}
    s = out["sampled"]
    assert s["episodes"] == 6
    assert s["success_rate"] == pytest.approx(3 / 6)
    assert s["mean_reward"] == pytest.approx(4 / 6)
    assert s["pass@1"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert s["pass@2"] == pytest.approx((1 + 0 + 1) / 3) == out["pass_at_k"]
    assert s["tool_use_rate"] == pytest.approx(5 / 6)
    assert "format_rate" not in g  # these episodes come from an env without a format part


def test_format_rate_counts_well_formed_answers_over_all_episodes() -> None:
    # Well-formed and right, well-formed and wrong, malformed, and an episode that never answered (no parts).
    greedy = [episode(1.0, parts={"format": 1.0}), episode(0.0, parts={"format": 1.0}),
              episode(0.0, parts={"format": 0.0}), episode(0.0, status="max_turns")]
    out = summarize(greedy, [[]] * 4)
    assert out["greedy"]["format_rate"] == pytest.approx(2 / 4)


# The default tokenizer's vocabulary; everything else as small as the engine allows.
SMALL = dataclasses.replace(ModelConfig.tiny(), d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def test_evaluate_opens_the_configured_engine_backend_and_writes_the_results_once(local_store: Store,
                                                                                  monkeypatch) -> None:
    # The plain-answer agent keeps prompts short (no tool schemas): one small prefill bucket to compile.
    base = CampaignConfig.tiny()
    config = dataclasses.replace(
        base, model=SMALL, agent=AgentConfig(kind="model"),
        engine=EngineConfig(num_slots=4, max_seq_len=96, prefill_buckets=(96,)),
        rollout=dataclasses.replace(base.rollout, max_new_tokens=6, max_tokens=96),
        trainer=dataclasses.replace(base.trainer, seq_buckets=(96,)),
        eval=EvalConfig(n_tasks=3, samples=2, max_concurrency=4),
    )
    prep(local_store, DatasetConfig(n_train=4, n_heldout=5))
    publish_weights(local_store, Decoder(SMALL, rngs=nnx.Rngs(0)), version=0, step=0)

    assert sorted(ENGINE_BACKENDS) == sorted(ENGINE_KINDS)  # a kind the config accepts always opens
    opened = []
    jax_backend = ENGINE_BACKENDS["jax"]

    def recording(store, version, engine_config, scratch, log):
        opened.append((version, engine_config.mesh))
        return jax_backend(store, version, engine_config, scratch, log)

    monkeypatch.setitem(ENGINE_BACKENDS, "jax", recording)
    lines: list[str] = []
    results = evaluate(local_store, config, version=0, log=lines.append)
    assert opened == [(0, config.eval.mesh)]
    # what it scored and how long it took, the engine's start included
    said = re.fullmatch(r"evaluate v0: greedy ([\d.]+)% on 3 held-out tasks in ([\d.]+) s \(scoring ([\d.]+) s\)",
                        lines[-1])
    assert said is not None and float(said[1]) == round(100 * results.greedy_success_rate, 1)
    assert float(said[2]) >= float(said[3]) == round(results.wall_s, 1)
    assert EvalResult.read(local_store, 0) == results
    assert (results.version, results.tasks, results.k, results.split) == (0, 3, 2, "heldout")
    assert results.pass_at_k is not None and results.wall_s > 0 and results.generated_tokens > 0
    assert results.greedy["episodes"] == 3 and results.sampled is not None and results.sampled["episodes"] == 6
    for stats in (results.greedy, results.sampled):
        assert set(stats) >= {"success_rate", "mean_reward", "avg_turns", "tool_use_rate", "statuses",
                              "failure_kinds"}
        assert sum(stats["statuses"].values()) == stats["episodes"]
        assert stats["avg_turns"] >= 1
    assert {"pass@1", "pass@2"} <= set(results.sampled)

    before = local_store.read(eval_path(0))
    assert evaluate(local_store, config, version=0) == results
    assert local_store.read(eval_path(0)) == before and len(opened) == 1
