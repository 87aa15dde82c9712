"""Infrastructure failures are not the policy's: classified, retried within a budget, recorded with their reason,
and their groups kept out of the loss (the tailer skips them with that reason)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from drills.infra_faults import DEPENDENCY_TIMEOUT, SANDBOX_START, FaultyTool, run_infra_drill
from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.engine.api import SamplingParams
from pipelines_lib.engine.scripted import ScriptedEngine
from pipelines_lib.envs import InfraError, make_env, run_tool
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.reader import ShardTailer
from pipelines_lib.trajectory.record import to_table
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.trainable import TrainerNeeds
from pipelines_lib.trajectory.validate import validate_table
from pipelines_lib.trajectory.window import Window
from pipelines_lib.trajectory.writer import ShardWriter


def arithmetic_episode(tok: ChatTokenizer, *, failures: int, kind: str, retries: int):
    env = make_env("arithmetic")
    injected: list[str] = []
    env.wrap_tools(lambda tool: FaultyTool(tool, failures=failures, kind=kind, injected=injected))
    task = type(env).generate_tasks(seed=0, n=1, split="train")[0]
    demo = env.demonstration(task)
    first: list[int] = []

    def script(prompt: list[int], _: int) -> str:
        if not first:
            first.append(len(prompt))
        return demo[2]["content"] if len(prompt) == first[0] else demo[4]["content"]

    traj = asyncio.run(run_episode(
        env=env, task=task, agent=make_agent(AgentConfig(), tok), engine=ScriptedEngine(script, tokenizer=tok),
        tokenizer=tok, sampling=SamplingParams(max_new_tokens=64), group_id="g0", sample_idx=0, group_size=1,
        worker_id="w0", episode_timeout_s=10.0, tool_timeout_s=1.0, max_tokens=1024, failure_reward=-1.0,
        infra_retries=retries))
    assert validate_table(to_table([traj])) == []
    return traj, injected


def test_run_tool_lets_an_infrastructure_failure_through_instead_of_showing_it_to_the_model() -> None:
    tool = FaultyTool(make_env("arithmetic").tools()["calculator"].inner, failures=1, kind=SANDBOX_START,
                      injected=[])
    with pytest.raises(InfraError, match="sandbox could not start"):
        asyncio.run(run_tool(tool, {"expression": "1+1"}, 1.0))
    text, error, _ = asyncio.run(run_tool(tool, {"expression": "1+1"}, 1.0))  # the second call goes through
    assert (text, error) == ("2", None)


@pytest.mark.parametrize("kind", [SANDBOX_START, DEPENDENCY_TIMEOUT])
def test_a_fault_that_outlasts_the_budget_is_recorded_as_infra_error_with_its_reason(
        tok: ChatTokenizer, kind: str) -> None:
    traj, injected = arithmetic_episode(tok, failures=3, kind=kind, retries=2)
    assert injected == [kind] * 3  # one attempt and two retries, each failing at its tool call
    assert traj.status == "infra_error" and traj.reward == -1.0
    assert traj.status_reason is not None and traj.status_reason.startswith("InfraError: ")
    assert ("sandbox could not start" if kind == SANDBOX_START else "dependency timed out") in traj.status_reason
    assert traj.status_reason.endswith("(3 attempts)")


def test_a_fault_within_the_budget_is_retried_and_the_episode_is_the_clean_attempt(tok: ChatTokenizer) -> None:
    traj, injected = arithmetic_episode(tok, failures=1, kind=SANDBOX_START, retries=1)
    assert injected == [SANDBOX_START]
    assert traj.status == "ok" and traj.reward == 1.0 and traj.status_reason is None
    assert [t.role for t in traj.turns].count("tool") == 1  # only the successful attempt's turns are recorded


def test_rollout_config_refuses_a_negative_retry_budget() -> None:
    with pytest.raises(ValueError, match="infra_retries must be >= 0, got -1"):
        dataclasses.replace(RolloutConfig.tiny(), infra_retries=-1)


def test_the_tailer_skips_a_group_holding_an_infra_error_with_the_reason(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    writer = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=3))
    groups = [synthetic_group(prompt_id=f"p{i}", group_size=4, worker_id="w0", policy_version=0, seed=i)
              for i in range(3)]
    groups[1][2] = dataclasses.replace(groups[1][2], status="infra_error",
                                       status_reason="InfraError: sandbox could not start (2 attempts)")
    groups[2][0] = dataclasses.replace(groups[2][0], status="engine_error", status_reason="EngineUnavailableError: x")
    for g in groups:
        writer.add_group(g)
    writer.flush()
    tailer = ShardTailer(store, needs=TrainerNeeds(group_size=4, max_tokens=512, vocab_size=512))
    got = tailer.next_groups(3, Window(version=0, eta=0))
    assert [g.group_id for g in got] == ["p0@w0"]
    skipped = [(e.kind, e.groups, e.reason) for e in tailer.drain_events()]
    assert skipped == [
        ("skipped", ("p1@w0",), "infrastructure failure: group p1@w0 has 1 trajectory(ies) with status in "
                                "('infra_error', 'engine_error') (sample 2: infra_error: InfraError: sandbox could "
                                "not start (2 attempts))"),
        ("skipped", ("p2@w0",), "infrastructure failure: group p2@w0 has 1 trajectory(ies) with status in "
                                "('infra_error', 'engine_error') (sample 0: engine_error: EngineUnavailableError: x)"),
    ]
    assert tailer.cursor.groups_skipped == 2


@pytest.mark.slow  # ~80 s on 2 shared cores; the episode and tailer tests above pin each half in seconds
def test_infra_drill_keeps_every_injected_failure_out_of_the_gradient(tmp_path) -> None:
    report = run_infra_drill(tmp_path, n_groups=9, retries=1, progress=lambda _: None)
    assert report.injected == 9 and report.injected_sandbox_start == 6 and report.injected_dependency_timeout == 3
    assert report.recovered_episodes == 3 and report.infra_trajectories == 3
    assert report.groups_skipped_infra == report.infra_groups == 3
    assert report.infra_errors_in_gradient == 0
    assert (report.groups_trained, report.steps) == (6, 3)
