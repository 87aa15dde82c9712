"""How the campaign turns (task, group, sample) into an episode: one place for rollout and evaluation.

``make_episode_fn`` binds the env registry, the latency profile around the env's tools, the agent and the
engine into the ``EpisodeFn`` the orchestrator calls. Each episode gets a fresh env and agent (they hold
per-episode state) and a per-sample seed, so sampling is reproducible whatever else runs concurrently.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

from pipelines_lib.agents import make_agent, run_episode
from pipelines_lib.config import CampaignConfig
from pipelines_lib.engine.api import Engine, SamplingParams
from pipelines_lib.envs import env_class, make_env
from pipelines_lib.envs.base import Task, Tool
from pipelines_lib.envs.tools.latency import LatencyTool
from pipelines_lib.envs.tools.sandbox import PythonSandbox
from pipelines_lib.model.tokenizer import (
    ChatTokenizer,
    default_tokenizer_dir,
    ensure_default_tokenizer,
    load_tokenizer,
)
from pipelines_lib.rollout.orchestrator import EpisodeFn
from pipelines_lib.trajectory.record import Trajectory


def campaign_tokenizer_dir(config: CampaignConfig, *, cache: Path | None = None) -> Path:
    """The configured tokenizer folder, or the embedded default's (built on first use under ``cache``, the
    process's cache folder: ``Settings.cache``; None: the repository's ``build/``)."""
    return Path(config.tokenizer) if config.tokenizer else ensure_default_tokenizer(default_tokenizer_dir(cache))


def campaign_tokenizer(config: CampaignConfig, *, cache: Path | None = None) -> ChatTokenizer:
    return load_tokenizer(campaign_tokenizer_dir(config, cache=cache))


def sample_seed(*parts: object) -> int:
    """A stable 31-bit seed from names (never Python's randomised ``hash``)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


@contextlib.asynccontextmanager
async def env_sandbox(config: CampaignConfig) -> AsyncIterator[PythonSandbox | None]:
    """The sandbox a run's episodes share, with its warm pool started, when the env runs model code (else None).
    Entering it is where a run without the configured isolation stops (``SandboxUnavailable``)."""
    if not env_class(config.env.name).runs_code:
        yield None
        return
    async with PythonSandbox(config.env.sandbox) as sandbox:
        yield sandbox


def make_episode_fn(config: CampaignConfig, *, engine: Engine, tokenizer: ChatTokenizer, worker_id: str,
                    temperature: float | None = None, seed_salt: str = "",
                    sandbox: PythonSandbox | None = None) -> EpisodeFn:
    """Episodes of the campaign's env and agent; code envs use ``sandbox`` (from :func:`env_sandbox`) when given."""
    rc = config.rollout
    profile = config.env.tool_latency

    async def episode(task: Task, group_id: str, sample_idx: int) -> Trajectory:
        env = make_env(task.env_name, sandbox=sandbox)
        if profile.kind != "fixed" or profile.value_s > 0:
            rng = random.Random(sample_seed("latency", seed_salt, group_id, sample_idx))
            env.wrap_tools(lambda tool: _with_latency(tool, rng))
        sampling = SamplingParams(temperature=rc.temperature if temperature is None else temperature,
                                  top_p=rc.top_p, top_k=rc.top_k, max_new_tokens=rc.max_new_tokens,
                                  seed=sample_seed(seed_salt, group_id, sample_idx))
        return await run_episode(
            env=env, task=task, agent=make_agent(config.agent, tokenizer), engine=engine, tokenizer=tokenizer,
            sampling=sampling, group_id=group_id, sample_idx=sample_idx, group_size=rc.group_size,
            worker_id=worker_id, episode_timeout_s=rc.episode_timeout_s, tool_timeout_s=rc.tool_timeout_s,
            max_tokens=rc.max_tokens, failure_reward=rc.failure_reward)

    def _with_latency(tool: Tool, rng: random.Random) -> Tool:
        return LatencyTool(tool, profile, rng=rng)

    return episode
