"""run_tool (failures become statuses), the latency wrapper and its profiles, and the search tool."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from typing import Any

import pytest

from pipelines_lib.envs import LatencyProfile, Tool, ToolError, make_tool, run_tool, with_latency
from pipelines_lib.envs.knowledge import KnowledgeBase, KnowledgeConfig
from pipelines_lib.envs.tools.latency import LatencyTool


class Echo(Tool):
    name = "echo"
    description = "echo"
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

    async def __call__(self, arguments: dict[str, Any]) -> str:
        return arguments["text"]


class Failing(Tool):
    name = "failing"
    description = "always fails"
    parameters = {"type": "object", "properties": {}}

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def __call__(self, arguments: dict[str, Any]) -> str:
        raise self.exc


class Hanging(Tool):
    name = "hanging"
    description = "never answers"
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def __call__(self, arguments: dict[str, Any]) -> str:
        self.entered.set()
        await asyncio.sleep(60)
        return "never"


def fake_clock(step: float) -> Any:
    ticks = iter(range(1000))
    return lambda: next(ticks) * step


def test_run_tool_returns_result_and_latency_from_the_clock() -> None:
    text, kind, latency = asyncio.run(run_tool(Echo(), {"text": "hi"}, 1.0, clock=fake_clock(0.25)))
    assert (text, kind, latency) == ("hi", None, 0.25)


def test_run_tool_turns_tool_error_into_text() -> None:
    text, kind, _ = asyncio.run(run_tool(Failing(ToolError("bad argument 'x'")), {}, 1.0))
    assert (text, kind) == ("Error: bad argument 'x'", "tool_error")


def test_run_tool_turns_a_tool_bug_into_text() -> None:
    text, kind, _ = asyncio.run(run_tool(Failing(KeyError("oops")), {}, 1.0))
    assert kind == "tool_error"
    assert text == "Error: internal error in tool 'failing': KeyError: 'oops'"


def test_run_tool_times_out_a_hanging_tool() -> None:
    text, kind, latency = asyncio.run(run_tool(Hanging(), {}, 0.05))
    assert (text, kind) == ("Error: tool 'hanging' timed out after 0.05 s", "timeout")
    assert latency > 0.04  # about the timeout; how much later the loop noticed depends on the machine, so no upper bound


def test_run_tool_lets_cancellation_through() -> None:
    async def main() -> None:
        tool = Hanging()
        task = asyncio.create_task(run_tool(tool, {}, 10.0))
        await tool.entered.wait()  # cancelled inside the tool call, not before it starts
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_run_tool_rejects_a_nonpositive_timeout() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        asyncio.run(run_tool(Echo(), {"text": "x"}, 0))


def test_fixed_and_none_profiles() -> None:
    rng = random.Random(0)
    assert LatencyProfile.none().sample(rng) == 0.0
    assert LatencyProfile.fixed(0.3).sample(rng) == 0.3


def test_light_profile_is_uniform_10_to_50_ms() -> None:
    rng = random.Random(0)
    xs = [LatencyProfile.light().sample(rng) for _ in range(20_000)]
    assert min(xs) >= 0.010 and max(xs) <= 0.050
    assert statistics.fmean(xs) == pytest.approx(0.030, abs=0.0005)  # (10 + 50) / 2 ms
    assert statistics.pstdev(xs) == pytest.approx(0.040 / math.sqrt(12), rel=0.02)  # (hi - lo) / sqrt(12)


def test_heavy_profile_is_lognormal_with_median_200_ms_capped_at_5_s() -> None:
    rng = random.Random(0)
    xs = [LatencyProfile.heavy().sample(rng) for _ in range(20_000)]
    assert statistics.median(xs) == pytest.approx(0.200, rel=0.05)
    assert max(xs) == 5.0
    # P(capped) = P(Z > ln(5 / 0.2) / 1.5) = P(Z > 2.146) = 0.0159
    assert sum(x == 5.0 for x in xs) / len(xs) == pytest.approx(0.0159, abs=0.003)


def test_profile_validation_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="lo_s=0.5, hi_s=0.1"):
        LatencyProfile.uniform(0.5, 0.1)
    with pytest.raises(ValueError, match="kind must be"):
        LatencyProfile(kind="gamma")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lognormal needs value_s > 0"):
        LatencyProfile.lognormal(0.0, 1.0, 1.0)


def test_latency_tool_sleeps_the_sampled_delay_before_calling() -> None:
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    tools = with_latency({"echo": Echo()}, LatencyProfile.light(), rng=random.Random(7), sleep=record)
    results = [asyncio.run(tools["echo"]({"text": str(i)})) for i in range(3)]
    assert results == ["0", "1", "2"]
    expected_rng = random.Random(7)
    assert slept == [expected_rng.uniform(0.010, 0.050) for _ in range(3)]
    assert tools["echo"].schema() == Echo().schema()


def test_latency_tool_with_no_latency_never_sleeps() -> None:
    async def forbidden(seconds: float) -> None:
        raise AssertionError("slept")

    tool = LatencyTool(Echo(), LatencyProfile.none(), rng=random.Random(0), sleep=forbidden)
    assert asyncio.run(tool({"text": "x"})) == "x"


def test_latency_counts_toward_run_tool_timeout() -> None:
    tool = LatencyTool(Echo(), LatencyProfile.fixed(5.0), rng=random.Random(0))
    text, kind, _ = asyncio.run(run_tool(tool, {"text": "x"}, 0.05))
    assert kind == "timeout"


def test_search_finds_entities_and_suggests_near_misses() -> None:
    kb = KnowledgeBase.generate(KnowledgeConfig(n_countries=2, n_cities=3, n_people=4))
    search = make_tool("search", kb=kb)
    person = next(iter(kb.people.values()))
    assert asyncio.run(search({"query": person.name})) == person.entry()
    assert asyncio.run(search({"query": person.name.lower()})) == person.entry()  # case-insensitive
    assert asyncio.run(search({"query": f"Where was {person.name} born?"})) == person.entry()
    missing = asyncio.run(search({"query": person.name + "x"}))
    assert missing.startswith(f"No entry for '{person.name}x'.") and person.name in missing
    with pytest.raises(ToolError, match="missing argument 'query'"):
        asyncio.run(search({}))


def test_knowledge_base_is_deterministic_and_consistent() -> None:
    a = KnowledgeBase.generate(KnowledgeConfig(seed=3))
    assert a == KnowledgeBase.generate(KnowledgeConfig(seed=3))
    assert a != KnowledgeBase.generate(KnowledgeConfig(seed=4))
    assert len(set(a.names())) == 8 + 24 + 500  # names never collide
    for p in a.people.values():
        assert p.born_in in a.cities and p.works_in in a.cities
    for c in a.countries.values():
        assert a.cities[c.capital].country == c.name
