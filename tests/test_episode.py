"""``run_episode``: strict token-in/token-out, and every way an episode can end gives a valid trajectory."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import pytest

from pipelines_lib import telemetry
from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.scripted import ScriptedEngine, fake_logprob
from pipelines_lib.envs import (
    ENV_REGISTRY,
    BaseTaskEnv,
    StepResult,
    Task,
    Tool,
    ToolError,
    hermes_tool_call,
    make_env,
)
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.trajectory.record import Trajectory, to_table
from pipelines_lib.trajectory.validate import validate_table


class _ScriptedTool(Tool):
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, name: str, behaviour: str, on_call: Any = None) -> None:
        self.name, self.behaviour, self.on_call = name, behaviour, on_call
        self.description = f"A tool that {behaviour}s."

    async def __call__(self, arguments: dict[str, Any]) -> str:
        if self.on_call is not None:
            self.on_call()
        if self.behaviour == "raise":
            raise RuntimeError("boom")
        if self.behaviour == "refuse":
            raise ToolError("bad input")
        if self.behaviour == "hang":
            await asyncio.sleep(30)
        return "done"


class ProbeEnv(BaseTaskEnv):
    """Scores ``<answer>ok</answer>``; can reply with feedback, or fail in ``reset``/``step``."""

    name = "probe"
    system_prompt = "Answer ok."

    def __init__(self, *, max_turns: int = 4, tools: tuple[Tool, ...] = (), feedback_turns: int = 0,
                 fail_in: str | None = None, feedback: str = "Try again.") -> None:
        super().__init__(max_turns=max_turns)
        self._set_tools(list(tools))
        self.feedback_left = feedback_turns
        self.fail_in = fail_in
        self.feedback = feedback

    async def reset(self, task: Task) -> list[dict[str, Any]]:
        if self.fail_in == "reset":
            raise RuntimeError("reset failed")
        return await super().reset(task)

    async def step(self, response: str) -> StepResult:
        if self.fail_in == "step":
            raise RuntimeError("step failed")
        if self.feedback_left > 0:
            self.feedback_left -= 1
            return StepResult(reward=0.25, done=False, reward_parts={"partial": 0.25},
                              messages=[{"role": "user", "content": self.feedback}] if self.feedback else [])
        return await super().step(response)

    def reward(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        ok = float(response.strip() == "<answer>ok</answer>")
        return ok, {"correct": ok}

    @classmethod
    def generate_tasks(cls, *, seed: int, n: int, split: str, config: Any = None) -> list[Task]:
        return [Task(task_id=f"probe-{i}", env_name="probe", prompt="Say ok.", answer="ok") for i in range(n)]

    def _demonstration(self, task: Task, *, corrupt: bool, rng: Any) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "<answer>ok</answer>"}]


PROBE_TASK = Task(task_id="probe-0", env_name="probe", prompt="Say ok.", answer="ok")


def episode(env: BaseTaskEnv, task: Task, engine: ScriptedEngine, tok: ChatTokenizer, *, agent: str = "tool",
            failure_reward: float = -1.0, **overrides: Any) -> Trajectory:
    config = AgentConfig(kind=agent, tool_failure_ends_episode=overrides.pop("tool_failure_ends_episode", False))
    kwargs: dict[str, Any] = {
        "episode_timeout_s": 10.0, "tool_timeout_s": 1.0, "max_tokens": 1024,
        "sampling": SamplingParams(max_new_tokens=64), **overrides,
    }
    traj = asyncio.run(run_episode(
        env=env, task=task, agent=make_agent(config, tok), engine=engine, tokenizer=tok, group_id="g0",
        sample_idx=0, group_size=1, worker_id="w0", failure_reward=failure_reward, **kwargs,
    ))
    assert validate_table(to_table([traj])) == []
    return traj


def arithmetic_case() -> tuple[BaseTaskEnv, Task, str, str]:
    env = make_env("arithmetic")
    task = type(env).generate_tasks(seed=0, n=1, split="train")[0]
    demo = env.demonstration(task)  # system, user, tool call, tool result, answer
    return env, task, demo[2]["content"], demo[4]["content"]


def test_engine_conditions_on_exactly_the_recorded_prefix_at_every_turn(tok: ChatTokenizer) -> None:
    env, task, call, answer = arithmetic_case()
    broken = '<tool_call>{"name": "calculator", "arguments": {</tool_call>'
    engine = ScriptedEngine([broken, call, answer], tokenizer=tok)
    traj = episode(env, task, engine, tok)
    assert traj.status == "ok" and traj.reward == 1.0
    tokens = list(traj.tokens)
    assert len(engine.prompts) == 3
    for k, prompt in enumerate(engine.prompts):
        assert prompt == tokens[: len(prompt)], f"turn {k}"
    assert engine.prompts[0] == tokens[: traj.prompt_len]
    # Between two prompts lie the sampled ids (loss 1, their logprobs) and then a rendered tool message (loss 0).
    for prev, nxt, text in zip(engine.prompts, engine.prompts[1:], [broken, call], strict=False):
        sampled = [*tok.encode(text), tok.stop_ids[0]]
        assert nxt[len(prev): len(prev) + len(sampled)] == sampled
        span = range(len(prev), len(prev) + len(sampled))
        assert [traj.loss_mask[i] for i in span] == [1] * len(sampled)
        assert [traj.logprobs[i] for i in span] == pytest.approx([fake_logprob(t) for t in sampled])
        assert set(traj.loss_mask[len(prev) + len(sampled): len(nxt)]) == {0}
    assert tokens[len(engine.prompts[-1]):] == [*tok.encode(answer), tok.stop_ids[0]]
    assert [t.role for t in traj.turns] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert traj.turns[3].error == "parse_error" and traj.turns[5].error is None


def test_rerendering_the_conversation_matches_only_for_canonical_generations(tok: ChatTokenizer) -> None:
    """Re-rendering the messages with the chat template reproduces the trajectory (minus the final "\\n" separator)
    when every generation is the canonical tokenisation of its text. A policy can sample any other spelling of
    the same text (here "<answer>" one byte-token at a time): re-tokenising merges it back, so a re-rendered
    sequence would differ from what was sampled and would not match the recorded logprobs. That is why the runner
    never re-renders."""
    env, task, call, answer = arithmetic_case()
    tools = [t.schema() for t in env.tools().values()]
    canonical = episode(env, task, ScriptedEngine([call, answer], tokenizer=tok), tok)
    messages = env.demonstration(task)
    assert tok.encode(tok.render_text(messages, tools=tools))[:-1] == list(canonical.tokens)

    spelled = [i for ch in answer for i in tok.encode(ch)] + [tok.stop_ids[0]]
    assert spelled != [*tok.encode(answer), tok.stop_ids[0]]
    other = episode(make_env("arithmetic"), task, ScriptedEngine([call, spelled], tokenizer=tok), tok)
    assert other.status == "ok" and other.reward == 1.0  # same text, same reward
    assert list(other.tokens[-len(spelled):]) == spelled  # the sampled ids, as sampled
    rerendered = tok.encode(tok.render_text(messages, tools=tools))[:-1]
    assert rerendered != list(other.tokens)
    assert tok.decode(rerendered) == tok.decode(other.tokens)


def test_policy_versions_follow_a_weight_swap_between_turns(tok: ChatTokenizer) -> None:
    engine: ScriptedEngine
    tool = _ScriptedTool("publish", "succeed", on_call=lambda: engine.swap_weights({"w": 1}, 7))
    engine = ScriptedEngine([hermes_tool_call("publish", {}), "<answer>ok</answer>"], tokenizer=tok, policy_version=6)
    traj = episode(ProbeEnv(tools=(tool,)), PROBE_TASK, engine, tok)
    assert traj.status == "ok"
    gen = [t for t in traj.turns if t.role == "assistant"]
    assert {traj.policy_version[i] for i in range(gen[0].start, gen[0].end)} == {6}
    assert {traj.policy_version[i] for i in range(gen[1].start, gen[1].end)} == {7}
    assert {v for v, m in zip(traj.policy_version, traj.loss_mask, strict=True) if not m} == {-1}


@pytest.mark.parametrize(("behaviour", "error", "content"), [
    ("raise", "tool_error", "Error: internal error in tool 'flaky': RuntimeError: boom"),
    ("refuse", "tool_error", "Error: bad input"),
    ("hang", "timeout", "timed out"),
])
def test_failed_tool_call_is_a_tool_message_and_the_episode_goes_on(
    tok: ChatTokenizer, behaviour: str, error: str, content: str
) -> None:
    engine = ScriptedEngine([hermes_tool_call("flaky", {}), "<answer>ok</answer>"], tokenizer=tok)
    start = time.perf_counter()
    traj = episode(ProbeEnv(tools=(_ScriptedTool("flaky", behaviour),)), PROBE_TASK, engine, tok, tool_timeout_s=0.05)
    assert time.perf_counter() - start < 5
    assert traj.status == "ok" and traj.reward == 1.0
    (tool_turn,) = [t for t in traj.turns if t.role == "tool"]
    assert tool_turn.error == error and tool_turn.tool_name == "flaky"
    assert content in tok.decode(traj.tokens[tool_turn.start:tool_turn.end])


def test_tool_failure_ends_the_episode_when_configured(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine([hermes_tool_call("flaky", {}), "<answer>ok</answer>"], tokenizer=tok)
    traj = episode(ProbeEnv(tools=(_ScriptedTool("flaky", "raise"),)), PROBE_TASK, engine, tok,
                   tool_failure_ends_episode=True)
    assert traj.status == "tool_error" and traj.reward == -1.0
    assert len(engine.prompts) == 1
    assert traj.turns[-1].role == "tool" and traj.turns[-1].error == "tool_error"
    assert not tok.decode(traj.tokens).endswith("<|im_start|>assistant\n")  # no generation prompt after the end


def test_env_step_raising_is_env_error(tok: ChatTokenizer) -> None:
    traj = episode(ProbeEnv(fail_in="step"), PROBE_TASK, ScriptedEngine(["<answer>ok</answer>"], tokenizer=tok), tok)
    assert traj.status == "env_error" and traj.reward == -1.0 and traj.reward_parts == {}
    assert traj.turns[-1].role == "assistant"


def test_env_continuing_without_a_message_is_env_error(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(["<answer>no</answer>"], tokenizer=tok)
    traj = episode(ProbeEnv(feedback_turns=1, feedback=""), PROBE_TASK, engine, tok, agent="model")
    assert traj.status == "env_error" and traj.reward == -1.0 and len(engine.prompts) == 1


def test_env_reset_raising_records_the_bare_task_prompt(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine([], tokenizer=tok)
    traj = episode(ProbeEnv(fail_in="reset"), PROBE_TASK, engine, tok)
    assert traj.status == "env_error" and engine.prompts == []
    assert tok.decode(traj.tokens) == "<|im_start|>user\nSay ok.<|im_end|>\n<|im_start|>assistant\n"
    assert traj.prompt_len == len(traj.tokens) and not any(traj.loss_mask)


def test_max_turns_when_the_agent_never_answers(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(lambda prompt, i: hermes_tool_call("echo", {}), tokenizer=tok)
    traj = episode(ProbeEnv(max_turns=3, tools=(_ScriptedTool("echo", "succeed"),)), PROBE_TASK, engine, tok)
    assert traj.status == "max_turns" and traj.reward == -1.0  # the env never scored
    assert len(engine.prompts) == 3
    assert [t.role for t in traj.turns].count("assistant") == 3


def test_max_turns_keeps_the_envs_running_reward(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(lambda prompt, i: "<answer>no</answer>", tokenizer=tok)
    traj = episode(ProbeEnv(max_turns=2, feedback_turns=5), PROBE_TASK, engine, tok, agent="model")
    assert traj.status == "max_turns" and traj.reward == 0.25 and traj.reward_parts == {"partial": 0.25}
    assert [t.role for t in traj.turns] == ["system", "user", "assistant", "env", "assistant"]


def test_env_feedback_continues_a_model_agent_episode(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(["<answer>no</answer>", "<answer>ok</answer>"], tokenizer=tok)
    traj = episode(ProbeEnv(feedback_turns=1, tools=(_ScriptedTool("echo", "succeed"),)), PROBE_TASK, engine, tok,
                   agent="model")
    assert traj.status == "ok" and traj.reward == 1.0
    env_turn = traj.turns[3]
    assert env_turn.role == "env"
    assert tok.decode(traj.tokens[env_turn.start:env_turn.end]) == (
        "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<tools>" not in tok.decode(traj.tokens[: traj.prompt_len])  # a model agent is not offered tools


def test_generation_cut_by_the_sequence_budget_is_max_tokens(tok: ChatTokenizer) -> None:
    env, task, call, answer = arithmetic_case()
    prompt_len = episode(env, task, ScriptedEngine([call, answer], tokenizer=tok), tok).prompt_len
    budget = prompt_len + 5
    traj = episode(make_env("arithmetic"), task, ScriptedEngine([call], tokenizer=tok), tok, max_tokens=budget)
    assert traj.status == "max_tokens" and len(traj.tokens) == budget
    # The engine's own context limit counts the same way.
    engine = ScriptedEngine([call], tokenizer=tok, max_seq_len=budget)
    traj = episode(make_env("arithmetic"), task, engine, tok)
    assert traj.status == "max_tokens" and len(traj.tokens) == budget


def test_tool_message_that_would_not_fit_ends_with_max_tokens(tok: ChatTokenizer) -> None:
    env, task, call, answer = arithmetic_case()
    full = episode(env, task, ScriptedEngine([call, answer], tokenizer=tok), tok)
    after_call = full.turns[2].end
    traj = episode(make_env("arithmetic"), task, ScriptedEngine([call, answer], tokenizer=tok), tok,
                   max_tokens=after_call + 3)
    assert traj.status == "max_tokens" and len(traj.tokens) == after_call


def test_prompt_longer_than_the_budget_is_cut(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine([], tokenizer=tok)
    traj = episode(ProbeEnv(), PROBE_TASK, engine, tok, max_tokens=4)
    assert traj.status == "max_tokens" and len(traj.tokens) == traj.prompt_len == 4 and engine.prompts == []


def test_episode_deadline_is_timeout_with_what_was_done(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(["<answer>ok</answer>"], tokenizer=tok, latency_s=30.0)
    start = time.perf_counter()
    traj = episode(ProbeEnv(), PROBE_TASK, engine, tok, episode_timeout_s=0.1)
    assert time.perf_counter() - start < 5
    assert traj.status == "timeout" and traj.reward == -1.0
    assert len(traj.tokens) == traj.prompt_len == len(engine.prompts[0])


def test_trajectory_provenance_and_timings(tok: ChatTokenizer) -> None:
    traj = episode(ProbeEnv(), PROBE_TASK, ScriptedEngine(["<answer>ok</answer>"], tokenizer=tok), tok)
    assert traj.trajectory_id == "g0/0/w0" and traj.prompt_id == "g0" and traj.env_name == "probe" and traj.task_id == "probe-0"
    assert traj.tokenizer_hash == tok.tokenizer_hash
    info = json.loads(traj.engine_info)
    assert info["engine"] == "ScriptedEngine" and info["agent"] == "tool"
    assert info["sampling"]["stop_ids"] == list(tok.stop_ids)  # defaulted from the tokenizer
    assert traj.timings.started_at <= traj.timings.finished_at
    assert traj.timings.reward_s > 0 and traj.timings.generate_s > 0


@pytest.mark.parametrize("env_name", sorted(ENV_REGISTRY))
def test_replaying_a_demonstration_scores_it_and_lays_tokens_out_as_sft_does(tok: ChatTokenizer, env_name: str) -> None:
    """Every env's perfect demonstration, replayed through the tool agent, gets the env's full reward, and the
    episode's tokens and loss mask equal ``encode_conversation`` of the demonstration (the SFT warm start's
    layout), so warm start and RL train on the same token layout."""
    env = make_env(env_name)
    task = type(env).generate_tasks(seed=3, n=1, split="train")[0]
    demo = env.demonstration(task)
    script = [m["content"] for m in demo if m["role"] == "assistant"]
    traj = episode(env, task, ScriptedEngine(script, tokenizer=tok), tok, max_tokens=2048)
    assert traj.status == "ok" and traj.reward == 1.0, traj.reward_parts
    ids, mask = tok.encode_conversation(demo, [t.schema() for t in env.tools().values()])
    assert list(traj.tokens) == ids and list(traj.loss_mask) == mask


# -- telemetry -----------------------------------------------------------------------------------------------

class QueueReportingEngine(ScriptedEngine):
    """Reports 5 ms of each call as queueing for an engine slot, as the JAX engine reports its slot queue."""

    async def generate(self, prompt_ids: Any, sampling: SamplingParams) -> Any:
        completion = await super().generate(prompt_ids, sampling)
        return dataclasses.replace(completion, timings={**completion.timings, "queue_s": 0.005})


def recorded_spans(run: Any) -> list[dict[str, Any]]:
    with telemetry.recording(None, "rollout-w0", sample_every_s=None) as recorder, telemetry.on_track("slot-000"):
        run()
        return [r for r in recorder.records if r["type"] == "span"]


def inside(child: dict[str, Any], parent: dict[str, Any]) -> bool:
    return parent["ts_us"] <= child["ts_us"] and child["ts_us"] + child["dur_us"] <= parent["ts_us"] + parent["dur_us"]


def test_episode_records_generate_tool_call_and_reward_spans_inside_its_episode_span(tok: ChatTokenizer) -> None:
    tool = _ScriptedTool("publish", "succeed", on_call=lambda: time.sleep(0.02))
    engine = ScriptedEngine([hermes_tool_call("publish", {}), "<answer>ok</answer>"], tokenizer=tok,
                            policy_version=6, latency_s=0.01)
    trajs: list[Trajectory] = []
    spans = recorded_spans(lambda: trajs.append(episode(ProbeEnv(tools=(tool,)), PROBE_TASK, engine, tok)))
    # Recorded as each span ends; the tool call is laid out when ``act`` returns.
    assert [s["name"] for s in spans] == ["env_reset", "generate", "tool_call.publish", "generate", "reward", "episode"]
    assert {s["track"] for s in spans} == {"slot-000"}
    ep = spans[-1]
    assert ep["tags"] == {"group": "g0", "sample": 0, "version": 6, "attempt": 0, "status": "ok"}
    assert all(inside(s, ep) for s in spans[:-1])
    gen0, tool_call, gen1, reward = spans[1:5]
    first_call = [t for t in trajs[0].turns if t.role == "assistant"][0]
    assert gen0["tags"] == {"turn": 0, "prompt_tokens": trajs[0].prompt_len, "tokens": first_call.end - first_call.start,
                            "version": 6, "finish": "stop"}
    assert gen0["dur_us"] >= 10_000 and gen1["tags"]["turn"] == 1
    assert tool_call["tags"] == {"tool": "publish"} and tool_call["dur_us"] >= 20_000
    assert gen0["ts_us"] + gen0["dur_us"] <= tool_call["ts_us"] <= tool_call["ts_us"] + tool_call["dur_us"] <= gen1["ts_us"]
    assert reward["tags"] == {"turn": 1, "reward": 1.0}


def test_an_env_step_that_continues_the_episode_is_an_env_step_span_not_a_reward(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(["<answer>no</answer>", "<answer>ok</answer>"], tokenizer=tok)
    spans = recorded_spans(lambda: episode(ProbeEnv(feedback_turns=1), PROBE_TASK, engine, tok))
    assert [(s["name"], s["tags"].get("turn")) for s in spans if s["name"] in ("env_step", "reward")] == [
        ("env_step", 0), ("reward", 1)]


def test_an_episode_cut_by_its_deadline_is_tagged_timeout_and_so_is_its_interrupted_generate(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(["<answer>ok</answer>"], tokenizer=tok, latency_s=5.0)
    spans = recorded_spans(lambda: episode(ProbeEnv(), PROBE_TASK, engine, tok, episode_timeout_s=0.05))
    by_name = {s["name"]: s for s in spans}
    assert by_name["episode"]["tags"]["status"] == "timeout"
    assert by_name["generate"]["tags"]["error"] == "CancelledError"


def test_engine_queueing_time_is_a_queue_wait_span_at_the_start_of_its_generate(tok: ChatTokenizer) -> None:
    engine = QueueReportingEngine(["<answer>ok</answer>"], tokenizer=tok, latency_s=0.01)
    spans = recorded_spans(lambda: episode(ProbeEnv(), PROBE_TASK, engine, tok))
    by_name = {s["name"]: s for s in spans}
    wait, gen = by_name["queue_wait"], by_name["generate"]
    assert inside(wait, gen) and wait["ts_us"] - gen["ts_us"] < 1000
    assert wait["dur_us"] == pytest.approx(5000, abs=1)
