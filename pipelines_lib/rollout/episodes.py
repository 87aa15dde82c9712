"""How (task, group, sample) becomes an episode: the one factory for rollout and evaluation, and its seed.

``make_episode_fn`` binds the campaign's env (``EnvSpec``: the env with its options), the latency profile around the
env's tools, the agent and the engine into the ``EpisodeFn`` the orchestrator (and the evaluator) calls. Each episode gets a fresh env and agent
(they hold per-episode state) and a per-sample seed from ``sample_seed``, so sampling is reproducible whatever
else runs concurrently. Rollout samples at ``rollout.temperature`` with the campaign's latency profile;
evaluation passes its own temperature, group size and no latency.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import AsyncIterator

from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.engine.api import Engine, SamplingParams
from pipelines_lib.envs import env_class
from pipelines_lib.envs.base import Task
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.envs.tools.latency import LatencyProfile, LatencyTool
from pipelines_lib.envs.tools.sandbox import PythonSandbox
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.rollout.orchestrator import EpisodeFn
from pipelines_lib.trajectory.record import Trajectory


def sample_seed(*parts: object) -> int:
    """A stable 31-bit seed from names (never Python's randomised ``hash``)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


@contextlib.asynccontextmanager
async def env_sandbox(env: EnvSpec | None) -> AsyncIterator[PythonSandbox | None]:
    """The sandbox a run's episodes share, with its warm pool started, when the env runs model code (else None;
    also for ``env`` None). Entering it is where a run without the configured isolation stops
    (``SandboxUnavailable``)."""
    if env is None or not env_class(env.name).runs_code:
        yield None
        return
    async with PythonSandbox(env.sandbox) as sandbox:
        yield sandbox


def make_episode_fn(rollout: RolloutConfig, agent: AgentConfig, *, engine: Engine, tokenizer: ChatTokenizer,
                    worker_id: str, env: EnvSpec | None = None, tool_latency: LatencyProfile | None = None,
                    temperature: float | None = None, group_size: int | None = None, seed_salt: str = "",
                    sandbox: PythonSandbox | None = None) -> EpisodeFn:
    """Episodes under ``rollout``'s budgets and sampling; ``temperature``/``group_size`` override its own. Each
    episode's env is made by ``env`` (the campaign's, with its options; default: each task's env with its defaults).
    Code envs run model code in ``sandbox`` (from :func:`env_sandbox`) when given."""
    spec = env or EnvSpec()
    profile = tool_latency or LatencyProfile.none()
    delayed = profile.kind != "fixed" or profile.value_s > 0

    async def episode(task: Task, group_id: str, sample_idx: int) -> Trajectory:
        env = spec.make(task.env_name, sandbox=sandbox)
        if delayed:
            rng = random.Random(sample_seed("latency", seed_salt, group_id, sample_idx))
            env.wrap_tools(lambda tool: LatencyTool(tool, profile, rng=rng))
        sampling = SamplingParams(temperature=rollout.temperature if temperature is None else temperature,
                                  top_p=rollout.top_p, top_k=rollout.top_k, max_new_tokens=rollout.max_new_tokens,
                                  seed=sample_seed(seed_salt, group_id, sample_idx))
        return await run_episode(
            env=env, task=task, agent=make_agent(agent, tokenizer), engine=engine, tokenizer=tokenizer,
            sampling=sampling, group_id=group_id, sample_idx=sample_idx,
            group_size=rollout.group_size if group_size is None else group_size, worker_id=worker_id,
            episode_timeout_s=rollout.episode_timeout_s, tool_timeout_s=rollout.tool_timeout_s,
            max_tokens=rollout.max_tokens, failure_reward=rollout.failure_reward,
            infra_retries=rollout.infra_retries)

    return episode


__all__ = ["env_sandbox", "make_episode_fn", "sample_seed"]
