"""Infrastructure-failure drill: sandbox start failures and dependency timeouts injected into real episodes never
reach a gradient.

```
 arithmetic episodes (real env, real calculator, the real agent and episode runner; a scripted engine)
   the calculator behind a FaultyTool: planned calls raise InfraError: "sandbox could not start", or a
   dependency awaited with a deadline that passes ("dependency timed out")
   run_episode retries an episode up to infra_retries times; a fault that outlasts the budget stays recorded
 groups written as shards into a campaign with a random-init v0
 the streaming trainer runs over them (every clean group trained, the campaign to its DONE marker)
 figures from storage: faults injected, episodes that recovered, infra_error trajectories written, groups the
 consumption logs skip for an infrastructure failure, and groups trained that hold one (must be 0)
```
The plan is fixed: of every three groups one has a sample whose faults outlast the budget (its group must be
skipped), one a sample that fails once and recovers (its group trains), one is clean; the last group is clean so
the trainer's last step reads past every planned fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines_lib.envs.base import InfraError, Tool

SANDBOX_START = "sandbox_start"
DEPENDENCY_TIMEOUT = "dependency_timeout"


class FaultyTool(Tool):
    """``inner`` whose first ``failures`` calls fail for an infrastructure reason of ``kind``; counts them."""

    def __init__(self, inner: Tool, *, failures: int, kind: str, injected: list[str]) -> None:
        self.inner, self.failures, self.kind, self.injected = inner, failures, kind, injected
        self.name, self.description, self.parameters = inner.name, inner.description, inner.parameters
        self.calls = 0

    async def __call__(self, arguments: dict[str, Any]) -> str:
        self.calls += 1
        if self.calls > self.failures:
            return await self.inner(arguments)
        self.injected.append(self.kind)
        if self.kind == SANDBOX_START:
            raise InfraError("sandbox could not start: OSError: [Errno 11] Resource temporarily unavailable (injected)")
        try:  # a dependency that never answers, awaited with a deadline as every outside call is
            await asyncio.wait_for(asyncio.Event().wait(), timeout=0.01)
        except TimeoutError as e:
            raise InfraError(f"dependency timed out after 0.01 s (injected, tool {self.name!r})") from e
        raise AssertionError("unreachable: the event is never set")


@dataclass(frozen=True, kw_only=True)
class InfraDrillReport:
    injected: int
    injected_sandbox_start: int
    injected_dependency_timeout: int
    recovered_episodes: int
    """Episodes that met a fault and ended without one (a retry succeeded)."""
    infra_trajectories: int
    """Trajectories written with status ``infra_error``."""
    infra_groups: int
    groups_skipped_infra: int
    """Groups the consumption logs skip with an infrastructure-failure reason."""
    infra_errors_in_gradient: int
    """Trained groups holding an infra-failed trajectory: must be 0."""
    groups_trained: int
    steps: int


def plan(n_groups: int, retries: int) -> list[tuple[int, str]]:
    """Per group: (faults of its sample 0, kind). Groups ``3k+1`` outlast the budget, ``3k+2`` recover."""
    out = []
    for i in range(n_groups):
        kind = SANDBOX_START if (i // 3) % 2 == 0 else DEPENDENCY_TIMEOUT
        out.append((retries + 1 if i % 3 == 1 else 1 if i % 3 == 2 else 0, kind))
    return out


def run_infra_drill(scratch: Path, *, n_groups: int = 9, retries: int = 1,
                    progress: Callable[[str], None] = print) -> InfraDrillReport:
    from flax import nnx

    from harness.fixtures import small_trainer_config
    from pipelines_lib.agents import AgentConfig, make_agent, run_episode
    from pipelines_lib.engine.api import SamplingParams
    from pipelines_lib.engine.scripted import ScriptedEngine
    from pipelines_lib.envs import make_env
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.model.tokenizer import open_tokenizer
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.records import consumption_logs
    from pipelines_lib.stages.campaign import init_campaign
    from pipelines_lib.stages.train import train
    from pipelines_lib.storage.store import Store
    from pipelines_lib.trajectory.channel import WriterConfig
    from pipelines_lib.trajectory.folder import FolderChannel
    from pipelines_lib.trajectory.schema import INFRA_STATUSES
    from pipelines_lib.trajectory.trainable import INFRA_REASON

    if n_groups % 3 != 0:
        raise ValueError(f"n_groups must be a multiple of 3 (the plan's period), got {n_groups}")
    tok = open_tokenizer(None)
    env_cls = type(make_env("arithmetic"))
    tasks = env_cls.generate_tasks(seed=0, n=n_groups, split="train")
    group_size = 4
    injected: list[str] = []
    recovered = 0
    groups = []
    for i, (failures, kind) in enumerate(plan(n_groups, retries)):
        group = []
        for k in range(group_size):
            env = make_env("arithmetic")
            env.wrap_tools(lambda tool, n=(failures if k == 0 else 0), kind=kind:
                           FaultyTool(tool, failures=n, kind=kind, injected=injected))
            demo = env.demonstration(tasks[i])  # system, user, tool call, tool result, answer
            first: list[int] = []

            def script(prompt: list[int], _: int, call: str = demo[2]["content"], answer: str = demo[4]["content"],
                       first: list[int] = first) -> str:
                if not first:
                    first.append(len(prompt))
                return call if len(prompt) == first[0] else answer  # every attempt starts over from the prompt

            before = len(injected)
            traj = asyncio.run(run_episode(
                env=env, task=tasks[i], agent=make_agent(AgentConfig(), tok),
                engine=ScriptedEngine(script, tokenizer=tok), tokenizer=tok,
                sampling=SamplingParams(max_new_tokens=64), group_id=f"g{i:03d}", sample_idx=k,
                group_size=group_size, worker_id="w0", episode_timeout_s=30.0, tool_timeout_s=5.0, max_tokens=192,
                infra_retries=retries))
            recovered += int(len(injected) > before and traj.status not in INFRA_STATUSES)
            group.append(traj)
        groups.append(group)
    infra_ids = {g[0].group_id for g in groups if any(t.status in INFRA_STATUSES for t in g)}
    progress(f"infra drill: {len(injected)} faults injected, {recovered} episodes recovered, "
             f"{len(infra_ids)} groups with an infrastructure failure")

    clean = n_groups - len(infra_ids)
    config = small_trainer_config(clean // 2, checkpoint_every=10_000)
    store = Store(str(scratch / "infra-drill"))
    init_campaign(store, config)
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)), version=0, step=0)
    writer = FolderChannel(store).writer("w0", WriterConfig(max_groups=3))
    for group in groups:
        writer.add_group(group)
    writer.flush()
    train(store, config, log=progress)

    logs = consumption_logs(store)
    trained = [g.group_id for log in logs for g in log.groups]
    skipped = [gid for log in logs for s in log.skipped if s.reason.startswith(INFRA_REASON)
               for gid in s.groups]
    return InfraDrillReport(
        injected=len(injected), injected_sandbox_start=injected.count(SANDBOX_START),
        injected_dependency_timeout=injected.count(DEPENDENCY_TIMEOUT), recovered_episodes=recovered,
        infra_trajectories=sum(t.status == "infra_error" for g in groups for t in g), infra_groups=len(infra_ids),
        groups_skipped_infra=len(skipped), infra_errors_in_gradient=sum(gid in infra_ids for gid in trained),
        groups_trained=len(trained), steps=len(logs))


__all__ = ["FaultyTool", "InfraDrillReport", "plan", "run_infra_drill"]
