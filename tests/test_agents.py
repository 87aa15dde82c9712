"""Agents (what a response means, how the token list grows) and the ScriptedEngine they are tested with."""

from __future__ import annotations

import asyncio

import pytest

from pipelines_lib.agents import AGENT_REGISTRY, AgentConfig, ModelAgent, ToolAgent, make_agent
from pipelines_lib.agents.base import FinalResponse, ToolMessages
from pipelines_lib.engine.api import Completion, SamplingParams
from pipelines_lib.engine.scripted import ScriptedEngine, fake_logprob
from pipelines_lib.envs import hermes_tool_call, make_env
from pipelines_lib.model.tokenizer import ChatTokenizer


def started(kind: str, tok: ChatTokenizer, **config: object) -> ToolAgent | ModelAgent:
    env = make_env("arithmetic")
    task = type(env).generate_tasks(seed=0, n=1, split="train")[0]
    agent = make_agent(AgentConfig(kind=kind, **config), tok)  # type: ignore[arg-type]
    agent.start(asyncio.run(env.reset(task)), env.tools())
    return agent  # type: ignore[return-value]


def test_config_names_the_valid_choices() -> None:
    with pytest.raises(ValueError, match=r"\['model', 'tool'\], got 'planner'"):
        AgentConfig(kind="planner")
    with pytest.raises(ValueError, match=r"parser must be one of .*'hermes'.*got 'xml'"):
        AgentConfig(parser="xml")
    with pytest.raises(ValueError, match="max_tool_response_chars must be >= 1, got 0"):
        AgentConfig(max_tool_response_chars=0)


def test_registry_builds_each_kind(tok: ChatTokenizer) -> None:
    assert set(AGENT_REGISTRY) == {"model", "tool"}
    assert isinstance(make_agent(AgentConfig(kind="model"), tok), ModelAgent)
    assert isinstance(make_agent(AgentConfig(kind="tool"), tok), ToolAgent)


def test_prompt_is_segmented_per_message_and_offers_tools_only_to_the_tool_agent(tok: ChatTokenizer) -> None:
    for kind, offered in (("tool", True), ("model", False)):
        agent = started(kind, tok)
        assert [s.info.role for s in agent.segments] == ["system", "user"]
        assert agent.segments[0].start == 0 and agent.segments[-1].end == agent.prompt_len == len(agent.tokens)
        system = tok.decode(agent.tokens[agent.segments[0].start:agent.segments[0].end])
        assert system.startswith("<|im_start|>system\n") and system.endswith("<|im_end|>\n")
        assert ('"name":"calculator"' in system) is offered
        assert tok.decode(agent.tokens).endswith("<|im_start|>assistant\n")
        assert set(agent.loss_mask) == {0} and set(agent.policy_versions) == {-1}


def test_generation_is_appended_as_sampled_and_decoded_without_the_stop_id(tok: ChatTokenizer) -> None:
    agent = started("tool", tok)
    ids = [*tok.encode("<answer>5</answer>"), tok.stop_ids[0]]
    n = len(agent.tokens)
    text = agent.add_generation(Completion(token_ids=ids, logprobs=[-0.5] * len(ids), policy_versions=[3] * len(ids),
                                           finish_reason="stop"), latency_s=0.01)
    assert text == "<answer>5</answer>"
    assert agent.tokens[n:] == ids and agent.loss_mask[n:] == [1] * len(ids)
    assert agent.logprobs[n:] == [-0.5] * len(ids) and agent.policy_versions[n:] == [3] * len(ids)
    assert agent.messages[-1] == {"role": "assistant", "content": "<answer>5</answer>"}
    assert agent.turn_closed


def test_a_turn_cut_before_its_stop_id_is_closed_before_the_next_message(tok: ChatTokenizer) -> None:
    agent = started("tool", tok)
    ids = tok.encode("<tool_call>{")
    agent.add_generation(Completion(token_ids=ids, logprobs=[-1.0] * len(ids), policy_versions=[0] * len(ids),
                                    finish_reason="length"), latency_s=0.0)
    assert not agent.turn_closed
    (rendered,) = agent.render_messages([{"role": "tool", "content": "Error: x"}])
    assert tok.decode(rendered).startswith("<|im_end|>\n<|im_start|>tool\n")


def test_tool_agent_runs_valid_calls_and_answers_malformed_ones_with_errors(tok: ChatTokenizer) -> None:
    agent = started("tool", tok)
    response = hermes_tool_call("calculator", {"expression": "6*7"}) + hermes_tool_call("shell", {"cmd": "ls"})
    action = asyncio.run(agent.act(response, tool_timeout_s=1.0))
    assert isinstance(action, ToolMessages)
    assert [m["content"] for m in action.messages] == [
        "42", "Error: unknown tool 'shell'; available tools: calculator",
    ]
    assert [(i.tool_name, i.error) for i in action.infos] == [("calculator", None), ("shell", "parse_error")]
    assert action.failed


def test_tool_agent_treats_a_response_without_calls_as_final(tok: ChatTokenizer) -> None:
    action = asyncio.run(started("tool", tok).act("<answer>42</answer>", tool_timeout_s=1.0))
    assert action == FinalResponse(text="<answer>42</answer>")


def test_model_agent_treats_everything_as_final(tok: ChatTokenizer) -> None:
    response = hermes_tool_call("calculator", {"expression": "1"})
    assert asyncio.run(started("model", tok).act(response, tool_timeout_s=1.0)) == FinalResponse(text=response)


def test_long_tool_output_is_cut_with_a_marker(tok: ChatTokenizer) -> None:
    agent = started("tool", tok, max_tool_response_chars=3)
    action = asyncio.run(agent.act(hermes_tool_call("calculator", {"expression": "10**8"}), tool_timeout_s=1.0))
    assert isinstance(action, ToolMessages)
    assert action.messages[0]["content"] == "100... [6 more characters cut]"


# ---- ScriptedEngine ----------------------------------------------------------------------------------


def generate(engine: ScriptedEngine, prompt: list[int], **sampling: object) -> Completion:
    return asyncio.run(engine.generate(prompt, SamplingParams(**sampling)))  # type: ignore[arg-type]


def test_scripted_engine_encodes_text_appends_the_stop_id_and_records_prompts(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(["hi", [5, 6]], tokenizer=tok, policy_version=2)
    stop = tok.stop_ids
    a = generate(engine, [1, 2], stop_ids=stop)
    assert a.token_ids == [*tok.encode("hi"), stop[0]] and a.finish_reason == "stop"
    assert a.logprobs == [fake_logprob(t) for t in a.token_ids] and a.policy_versions == [2] * len(a.token_ids)
    b = generate(engine, [3], stop_ids=stop)
    assert b.token_ids == [5, 6] and b.finish_reason == "length"  # an entry without a stop id ran out
    assert engine.prompts == [[1, 2], [3]]
    with pytest.raises(IndexError, match="script has 2 responses"):
        generate(engine, [4])


def test_scripted_engine_honours_max_new_tokens_and_context(tok: ChatTokenizer) -> None:
    engine = ScriptedEngine(lambda prompt, i: [7, 8, 9, 10], tokenizer=tok, max_seq_len=6)
    assert generate(engine, [1], max_new_tokens=2).token_ids == [7, 8]
    assert generate(engine, [1], max_new_tokens=2).finish_reason == "length"
    c = generate(engine, [1, 2, 3, 4])
    assert c.token_ids == [7, 8] and c.finish_reason == "context"
    assert generate(engine, [1] * 6).token_ids == []


def test_scripted_engine_sleeps_through_the_injected_sleep_and_swaps_weights(tok: ChatTokenizer) -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    engine = ScriptedEngine(["a", "b"], tokenizer=tok, latency_s=lambda i: 0.5 * (i + 1), sleep=fake_sleep)
    assert generate(engine, [1]).policy_versions[0] == 0
    engine.swap_weights({"w": 1}, 4)
    assert engine.policy_version == 4 and engine.params == {"w": 1}
    assert set(generate(engine, [1]).policy_versions) == {4}
    assert slept == [0.5, 1.0]
