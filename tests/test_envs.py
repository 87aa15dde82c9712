"""Built-in envs: registry, deterministic disjoint splits, rewards, demonstrations replayed through
the real tools, the imperfect-demonstration share, and the tokenizer corpus."""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any

import pytest

from pipelines_lib.envs import (
    ENV_REGISTRY,
    TOOL_REGISTRY,
    BaseTaskEnv,
    LatencyProfile,
    Message,
    Task,
    all_text_for_tokenizer,
    env_class,
    make_env,
    make_tool,
    run_tool,
)
from pipelines_lib.envs.arithmetic import MISTAKES, ArithmeticConfig, ArithmeticEnv
from pipelines_lib.envs.coding import CodeConfig, CodeEnv
from pipelines_lib.envs.multihop import MultihopConfig
from pipelines_lib.envs.tools.latency import LatencyTool
from pipelines_lib.envs.tools.sandbox import SandboxConfig
from pipelines_lib.envs.twostep import MISTAKES as TWOSTEP_MISTAKES
from pipelines_lib.envs.twostep import TwoStepConfig, TwoStepEnv, steps_of

ENVS = ["arithmetic", "twostep", "multihop", "code"]
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


async def replay(env: BaseTaskEnv, task: Task, demo: list[Message]) -> tuple[float, dict[str, float]]:
    """Play a demonstration through the env: tool calls hit the real tools and must reproduce the
    demonstration's tool results; the final answer is scored by ``step``."""
    assert await env.reset(task) == demo[:2]
    expected_tool_text = None
    for message in demo[2:]:
        if message["role"] == "tool":
            assert message["content"] == expected_tool_text
        elif m := TOOL_CALL.search(message["content"]):
            call = json.loads(m.group(1))
            expected_tool_text, kind, _ = await run_tool(env.tools()[call["name"]], call["arguments"], 10.0)
            assert kind is None
        else:
            result = await env.step(message["content"])
            assert result.done
            return result.reward, result.reward_parts
    raise AssertionError("demonstration has no final answer")


def test_registries_hold_the_builtins() -> None:
    assert sorted(ENV_REGISTRY) == ["arithmetic", "code", "multihop", "twostep"]
    assert sorted(TOOL_REGISTRY) == ["calculator", "python", "search"]
    assert env_class("arithmetic").name == "arithmetic"


def test_unknown_names_list_the_valid_ones_and_suggest() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown env 'arithmetc'; valid envs: arithmetic, code, multihop, twostep; did you mean 'arithmetic'\?",
    ):
        make_env("arithmetc")
    with pytest.raises(ValueError, match=r"unknown tool 'web'; valid tools: calculator, python, search$"):
        make_tool("web")


@pytest.mark.parametrize("name", ENVS)
def test_generation_is_deterministic_by_seed(name: str) -> None:
    cls = env_class(name)
    a = cls.generate_tasks(seed=1, n=30, split="train")
    assert a == cls.generate_tasks(seed=1, n=30, split="train")
    assert a != cls.generate_tasks(seed=2, n=30, split="train")
    assert len({t.task_id for t in a}) == 30
    assert all(t.env_name == name for t in a)
    assert cls.generate_tasks(seed=1, n=10, split="train") == a[:10]  # a prefix: n does not reshuffle


@pytest.mark.parametrize("name", ENVS)
def test_train_and_heldout_are_disjoint_across_seeds(name: str) -> None:
    cls = env_class(name)
    train = {t.prompt for seed in range(3) for t in cls.generate_tasks(seed=seed, n=100, split="train")}
    heldout = {t.prompt for seed in range(3) for t in cls.generate_tasks(seed=seed, n=25, split="heldout")}
    assert train and heldout and not train & heldout


def test_arithmetic_splits_are_disjoint_by_expression_not_phrasing() -> None:
    cls = env_class("arithmetic")
    train = {t.meta["expression"] for t in cls.generate_tasks(seed=0, n=2000, split="train")}
    heldout = {t.meta["expression"] for t in cls.generate_tasks(seed=0, n=500, split="heldout")}
    assert not train & heldout


def test_bad_split_and_exhausted_task_space_are_errors() -> None:
    cls = env_class("arithmetic")
    with pytest.raises(ValueError, match="split must be one of .* got 'test'"):
        cls.generate_tasks(seed=0, n=1, split="test")
    tiny_space = ArithmeticConfig(operand_digits=1, n_ops=1, operators="+")  # 81 expressions
    with pytest.raises(ValueError, match="found only .* distinct heldout tasks of 81 requested"):
        cls.generate_tasks(seed=0, n=81, split="heldout", config=tiny_space)


def test_task_records_round_trip() -> None:
    for name in ENVS:
        task = env_class(name).generate_tasks(seed=0, n=1, split="train")[0]
        record = task.to_record()
        assert all(isinstance(v, str) for v in record.values())
        assert Task.from_record(json.loads(json.dumps(record))) == task


GOLDEN_ARITHMETIC = Task(task_id="t", env_name="arithmetic", prompt="What is 37*48+129?", answer="1905",
                         meta={"expression": "37*48+129"})


def test_arithmetic_golden_task_and_rewards() -> None:
    env = make_env("arithmetic")
    task = GOLDEN_ARITHMETIC
    assert env.reward(task, "<answer>1905</answer>") == (1.0, {"correct": 1.0, "format": 1.0})
    assert env.reward(task, "<answer> 1905 </answer>") == (1.0, {"correct": 1.0, "format": 1.0})
    assert env.reward(task, "1905") == (0.0, {"correct": 0.0, "format": 0.0})
    assert env.reward(task, "<answer>1906</answer>") == (0.0, {"correct": 0.0, "format": 1.0})
    assert env.reward(task, "<answer>1</answer><answer>1905</answer>") == (
        1.0,
        {"correct": 1.0, "format": 0.0},
    )
    assert env.reward(task, "<answer>1905.0</answer>")[0] == 0.0  # exact match


def test_arithmetic_generation_respects_difficulty_knobs() -> None:
    cfg = ArithmeticConfig(operand_digits=3, n_ops=3, operators="*")
    for task in env_class("arithmetic").generate_tasks(seed=0, n=20, split="train", config=cfg):
        operands = task.meta["expression"].split("*")
        assert len(operands) == 4 and all(len(x) == 3 for x in operands)
        assert task.prompt in {
            p.format(expr=task.meta["expression"])
            for p in ("What is {expr}?", "Compute {expr}.", "Calculate {expr}.")
        }


def test_used_tool_counts_calls_through_the_env_tools() -> None:
    async def main() -> tuple[dict[str, float], dict[str, float]]:
        env = make_env("arithmetic")
        task = env_class("arithmetic").generate_tasks(seed=0, n=1, split="train")[0]
        await env.reset(task)
        without = (await env.step(f"<answer>{task.answer}</answer>")).reward_parts
        await env.reset(task)
        await run_tool(env.tools()["calculator"], {"expression": task.meta["expression"]}, 1.0)
        with_tool = (await env.step(f"<answer>{task.answer}</answer>")).reward_parts
        return without, with_tool

    without, with_tool = asyncio.run(main())
    assert without["used_tool"] == 0.0 and with_tool["used_tool"] == 1.0
    assert without["correct"] == with_tool["correct"] == 1.0


def test_wrap_tools_adds_latency_and_keeps_counting_calls() -> None:
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    async def main() -> dict[str, float]:
        env = make_env("arithmetic")
        env.wrap_tools(
            lambda t: LatencyTool(t, LatencyProfile.fixed(0.25), rng=random.Random(0), sleep=record)
        )
        task = env_class("arithmetic").generate_tasks(seed=0, n=1, split="train")[0]
        await env.reset(task)
        text, kind, _ = await run_tool(
            env.tools()["calculator"], {"expression": task.meta["expression"]}, 1.0
        )
        assert (text, kind) == (task.answer, None)
        return (await env.step(f"<answer>{text}</answer>")).reward_parts

    assert asyncio.run(main())["used_tool"] == 1.0
    assert slept == [0.25]


def test_max_turns_knob_and_validation() -> None:
    assert make_env("arithmetic", config=ArithmeticConfig(max_turns=7)).max_turns == 7
    assert make_env("multihop", config=MultihopConfig(max_turns=9)).max_turns == 9
    assert make_env("code", config=CodeConfig(max_turns=2)).max_turns == 2
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        ArithmeticConfig(max_turns=0)
    with pytest.raises(ValueError, match="operators must be a non-empty subset of '\\+-\\*', got '/'"):
        ArithmeticConfig(operators="/")


def test_reset_refuses_a_task_of_another_env() -> None:
    task = env_class("multihop").generate_tasks(seed=0, n=1, split="train")[0]
    with pytest.raises(ValueError, match="belongs to env 'multihop', not 'arithmetic'"):
        asyncio.run(make_env("arithmetic").reset(task))


@pytest.mark.parametrize(("name", "n"), [("arithmetic", 20), ("twostep", 20), ("multihop", 20), ("code", 4)])
def test_perfect_demonstrations_replay_to_reward_one(name: str, n: int) -> None:
    env = make_env(name)
    for task in env_class(name).generate_tasks(seed=0, n=n, split="heldout"):
        demo = env.demonstration(task)
        assert demo[0] == {"role": "system", "content": env.system_prompt}
        assert demo[1] == {"role": "user", "content": task.prompt}
        reward, parts = asyncio.run(replay(env, task, demo))
        assert reward == 1.0 and parts["correct"] == 1.0 and parts["used_tool"] == 1.0, demo


@pytest.mark.parametrize(("name", "n"), [("arithmetic", 20), ("twostep", 20), ("multihop", 20), ("code", 4)])
def test_flawed_demonstrations_replay_to_incorrect(name: str, n: int) -> None:
    env = make_env(name)
    for task in env_class(name).generate_tasks(seed=0, n=n, split="train"):
        reward, parts = asyncio.run(replay(env, task, env.demonstration(task, error_rate=1.0)))
        assert parts["correct"] == 0.0 and reward < 1.0


@pytest.mark.parametrize("mistake", MISTAKES)
def test_every_arithmetic_mistake_kind_replays_to_incorrect(mistake: str) -> None:
    env = ArithmeticEnv(config=ArithmeticConfig(mistakes=(mistake,)))
    for task in ArithmeticEnv.generate_tasks(seed=0, n=10, split="train"):
        demo = env.demonstration(task, error_rate=1.0)
        reward, parts = asyncio.run(replay(env, task, demo))
        assert parts["correct"] == 0.0 and reward < 1.0
        assert any(m["role"] == "tool" for m in demo) == (mistake != "no_tool")


def test_twostep_golden_task_steps_and_rewards() -> None:
    assert steps_of("37*48+21") == ("37*48", "1776+21")
    assert steps_of("15+20-99") == ("15+20", "35-99")
    task = Task(task_id="t", env_name="twostep", prompt="What is 37*48+21?", answer="1797",
                meta={"expression": "37*48+21"})
    env = make_env("twostep")
    assert env.reward(task, "<answer>1797</answer>") == (1.0, {"correct": 1.0, "format": 1.0})
    # The intermediate result is a well-formed wrong answer; a float or two answers are not well-formed.
    assert env.reward(task, "<answer>1776</answer>") == (0.0, {"correct": 0.0, "format": 1.0})
    assert env.reward(task, "<answer>1797.0</answer>") == (0.0, {"correct": 0.0, "format": 0.0})
    assert env.reward(task, "<answer>1</answer><answer>1797</answer>")[1] == {"correct": 1.0, "format": 0.0}


def test_twostep_calculator_does_one_operation_per_call() -> None:
    calculator = make_env("twostep").tools()["calculator"]

    def call(expression: str) -> tuple[str, str | None]:
        text, kind, _ = asyncio.run(run_tool(calculator, {"expression": expression}, 1.0))
        return text, kind

    assert call("37*48") == ("1776", None)
    assert call("-5+12") == ("7", None)  # a signed operand is still one operation
    assert call("37*48+21") == ("Error: expression too complex (8 > 7 parts)", "tool_error")


@pytest.mark.parametrize("mistake", TWOSTEP_MISTAKES)
def test_every_twostep_mistake_is_well_formed_but_wrong(mistake: str) -> None:
    env = TwoStepEnv(config=TwoStepConfig(mistakes=(mistake,)))
    for task in TwoStepEnv.generate_tasks(seed=0, n=10, split="train"):
        demo = env.demonstration(task, error_rate=1.0)
        reward, parts = asyncio.run(replay(env, task, demo))
        assert parts == {"correct": 0.0, "format": 1.0, "used_tool": 1.0}
        assert sum(m["role"] == "tool" for m in demo) == (1 if mistake == "stop_early" else 2)


def test_twostep_splits_are_disjoint_by_expression() -> None:
    cls = env_class("twostep")
    train = {t.meta["expression"] for t in cls.generate_tasks(seed=0, n=2000, split="train")}
    heldout = {t.meta["expression"] for t in cls.generate_tasks(seed=0, n=500, split="heldout")}
    assert len(train) == 2000 and len(heldout) == 500 and not train & heldout


def test_default_flawed_arithmetic_demonstrations_solve_it_but_answer_a_float() -> None:
    env = make_env("arithmetic")
    for task in env_class("arithmetic").generate_tasks(seed=0, n=10, split="train"):
        clean, flawed = env.demonstration(task), env.demonstration(task, error_rate=1.0)
        assert flawed[:-1] == clean[:-1]  # same tool call, same tool result: copying is taught by both
        assert flawed[-1]["content"] == f"<answer>{task.answer}.0</answer>" != clean[-1]["content"]
    with pytest.raises(ValueError, match="mistakes must be a non-empty subset .* got \\('typo',\\)"):
        ArithmeticConfig(mistakes=("typo",))


def test_arithmetic_demonstration_is_the_hermes_conversation() -> None:
    env = make_env("arithmetic")
    task = GOLDEN_ARITHMETIC
    assert env.demonstration(task)[2:] == [
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48+129"}}</tool_call>',
        },
        {"role": "tool", "name": "calculator", "content": "1905"},
        {"role": "assistant", "content": "<answer>1905</answer>"},
    ]


@pytest.mark.parametrize("name", ["arithmetic", "multihop"])
@pytest.mark.parametrize("error_rate", [0.0, 0.3])
def test_imperfect_share_is_about_the_error_rate(name: str, error_rate: float) -> None:
    env = make_env(name)
    tasks = env_class(name).generate_tasks(seed=0, n=1000, split="train")
    flawed = sum(
        env.reward(t, env.demonstration(t, error_rate=error_rate, seed=5)[-1]["content"])[0] == 0.0
        for t in tasks
    )
    assert flawed / len(tasks) == pytest.approx(error_rate, abs=0.04)  # binomial sd at 0.3: 0.0145


def test_imperfect_demonstrations_are_deterministic_per_seed() -> None:
    env = make_env("arithmetic")
    tasks = env_class("arithmetic").generate_tasks(seed=0, n=50, split="train")
    a = [env.demonstration(t, error_rate=0.5, seed=1) for t in tasks]
    assert a == [env.demonstration(t, error_rate=0.5, seed=1) for t in tasks]
    assert a != [env.demonstration(t, error_rate=0.5, seed=2) for t in tasks]
    with pytest.raises(ValueError, match="error_rate must be in \\[0, 1\\], got 1.5"):
        env.demonstration(tasks[0], error_rate=1.5)


def test_multihop_questions_need_two_or_three_lookups() -> None:
    env = make_env("multihop")
    hops = {
        t.meta["kind"]: sum(m["role"] == "tool" for m in env.demonstration(t))
        for t in env_class("multihop").generate_tasks(seed=0, n=40, split="train")
    }
    assert hops == {"born_country": 2, "work_country": 2, "born_capital": 3, "work_currency": 3}


def test_a_default_multihop_env_serves_tasks_of_another_world() -> None:
    cfg = MultihopConfig.tiny()
    tiny_task = env_class("multihop").generate_tasks(seed=0, n=1, split="train", config=cfg)[0]
    default_task = env_class("multihop").generate_tasks(seed=0, n=1, split="train")[0]
    env = make_env("multihop")
    for task in (tiny_task, default_task, tiny_task):
        assert asyncio.run(replay(env, task, env.demonstration(task)))[0] == 1.0
        assert task.meta["person"] in env.kb.people
    assert len(env.kb.people) == cfg.knowledge.n_people


def code_task() -> Task:
    return Task(
        task_id="code-golden",
        env_name="code",
        prompt="Write a Python function f(xs) that returns the sum of the numbers in xs that are divisible by 3.",
        answer="def f(xs):\n    return sum(x for x in xs if x % 3 == 0)\n",
        meta={
            "family": "sum_divisible",
            "params": {"a": 3},
            "tests": [[[[3, 4, 6]], 9], [[[]], 0], [[[1, 2]], 0], [[[-3, 5]], -3]],
        },
    )


@pytest.mark.parametrize(
    ("response", "passed"),
    [
        ("<answer>\ndef f(xs):\n    return sum(x for x in xs if x % 3 == 0)\n</answer>", 4),
        ("<answer>\n```python\ndef f(xs):\n    return sum(x for x in xs if x % 3 == 0)\n```\n</answer>", 4),
        ("<answer>\ndef f(xs):\n    return sum(xs)\n</answer>", 1),  # right only on []
        ("<answer>\ndef f(xs):\n    return 0\n</answer>", 2),  # [] and [1, 2]
        ("<answer>\ndef g(xs):\n    return 0\n</answer>", 0),  # wrong name
        ("def f(xs):\n    return sum(x for x in xs if x % 3 == 0)", 0),  # no answer tag
        ("<answer>\nwhile True:\n    pass\n</answer>", 0),  # hangs: killed, scores 0
        (
            '<answer>\nimport os\nprint(\'RESULT-0000 [["9"], ["0"], ["0"], ["-3"]]\')\nos._exit(0)\n</answer>',
            0,
        ),
    ],
    ids=["correct", "fenced", "sum_all", "zero", "wrong_name", "no_tag", "hang", "forged_result"],
)
def test_code_reward_is_the_fraction_of_hidden_tests_passed(response: str, passed: int) -> None:
    env = CodeEnv(config=CodeConfig(sandbox=SandboxConfig(timeout_s=1.0)))
    reward, parts = env.reward(code_task(), response)
    assert reward == passed / 4
    assert parts["correct"] == float(passed == 4)


def test_code_answer_too_long_for_the_sandbox_scores_zero() -> None:
    env = CodeEnv(config=CodeConfig(sandbox=SandboxConfig(max_code_chars=2000)))
    response = (
        "<answer>\ndef f(xs):\n    return sum(x for x in xs if x % 3 == 0)\n" + "#" * 2000 + "\n</answer>"
    )
    assert env.reward(code_task(), response) == (0.0, {"correct": 0.0, "tests_passed": 0.0, "format": 1.0})


def test_code_retries_with_feedback_when_attempts_remain() -> None:
    async def main() -> list[Any]:
        env = CodeEnv(config=CodeConfig(max_attempts=2, sandbox=CodeConfig.tiny().sandbox))
        await env.reset(code_task())
        first = await env.step("<answer>\ndef f(xs):\n    return 0\n</answer>")
        second = await env.step("<answer>\ndef f(xs):\n    return 0\n</answer>")
        return [first, second]

    first, second = asyncio.run(main())
    assert not first.done and first.reward == 0.5
    assert first.messages == [{"role": "user", "content": "Your function failed 2 of 4 tests. Try again."}]
    assert second.done and second.messages == []


def test_code_reward_inside_an_event_loop_points_to_score() -> None:
    async def main() -> None:
        CodeEnv().reward(code_task(), "<answer>x</answer>")

    with pytest.raises(RuntimeError, match="await env.score"):
        asyncio.run(main())


def test_tokenizer_corpus_is_deterministic_and_covers_every_env() -> None:
    texts = list(all_text_for_tokenizer(0, n_per_env=20))
    assert texts == list(all_text_for_tokenizer(0, n_per_env=20))
    for name in ENVS:
        assert make_env(name).system_prompt in texts
    joined = "\n".join(texts)
    for needle in (
        "<tool_call>",
        "</answer>",
        '"calculator"',
        "Error: division by zero",
        "[exit code 1]",
        "Try again.",
    ):
        assert needle in joined


def test_arithmetic_corpus_vocabulary_is_small() -> None:
    texts = list(all_text_for_tokenizer(0, n_per_env=500, env_names=["arithmetic"]))
    words = {w for t in texts for w in re.findall(r"[A-Za-z]+|\d|\S", t)}
    assert len(words) < 150
