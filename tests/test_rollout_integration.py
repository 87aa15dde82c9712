"""The orchestrator on real parts: the tiny decoder, the continuous-batching engine, real episodes, shards.

The model is untrained (these pin concurrency and bookkeeping, not quality), so episodes are single-turn
(``ModelAgent``) and the slow external service is the env's scoring call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from itertools import count

from flax import nnx

from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.engine import EngineConfig, JaxEngine, SamplingParams
from pipelines_lib.envs import env_class
from pipelines_lib.envs.arithmetic import ArithmeticEnv
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ensure_default_tokenizer, load_tokenizer
from pipelines_lib.rollout.config import RolloutConfig
from pipelines_lib.rollout.orchestrator import Orchestrator
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.codec import read_shard
from pipelines_lib.trajectory.validate import validate_table
from pipelines_lib.trajectory.writer import ShardWriter

TOKENIZER = load_tokenizer(ensure_default_tokenizer())
MODEL_CFG = dataclasses.replace(ModelConfig.tiny(), n_layers=1, max_seq_len=160)
ENGINE_CFG = EngineConfig(num_slots=8, max_seq_len=160, prefill_buckets=(64, 128))


class SlowScoringEnv(ArithmeticEnv):
    """Arithmetic whose scoring call waits like a remote grader; records when each wait happened."""

    waits: list[tuple[float, float]] = []

    async def step(self, response: str):
        t0 = time.perf_counter()
        await asyncio.sleep(0.15)
        SlowScoringEnv.waits.append((t0, time.perf_counter()))
        return await super().step(response)


def tasks():
    pool = env_class("arithmetic").generate_tasks(seed=0, n=64, split="train")
    for i in count():
        yield pool[i % len(pool)], f"{pool[i % len(pool)].task_id}.e{i // len(pool)}"


def make_episode_fn(engine, generations: list[tuple[float, float]]):
    class Timed:
        policy_version = property(lambda self: engine.policy_version)
        max_seq_len = property(lambda self: engine.max_seq_len)

        async def generate(self, ids, sampling):
            t0 = time.perf_counter()
            out = await engine.generate(ids, sampling)
            generations.append((t0, time.perf_counter()))
            return out

        def swap_weights(self, params, version):
            engine.swap_weights(params, version)

    timed = Timed()

    async def episode(task, group_id, idx):
        return await run_episode(
            env=SlowScoringEnv(), task=task, agent=make_agent(AgentConfig(kind="model"), TOKENIZER), engine=timed,
            tokenizer=TOKENIZER, sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=idx),
            group_id=group_id, sample_idx=idx, group_size=4, worker_id="w0", episode_timeout_s=60,
            tool_timeout_s=5, max_tokens=160)
    return episode


def test_engine_generates_for_some_episodes_while_others_wait_and_all_groups_land(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    model = Decoder(MODEL_CFG, rngs=nnx.Rngs(0))
    generations: list[tuple[float, float]] = []
    SlowScoringEnv.waits = []

    async def main():
        async with JaxEngine(model, ENGINE_CFG) as engine:
            orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=16, target_groups=8),
                                engine=engine, episode_fn=make_episode_fn(engine, generations), tasks=tasks(),
                                writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=2)))
            return await asyncio.wait_for(orch.run(), 300)

    stats = asyncio.run(main())
    assert stats.groups_committed == 8
    rows = []
    for name in store.list("trajectories/v00000000"):
        table, _ = read_shard(store, f"trajectories/v00000000/{name}")
        assert validate_table(table) == []
        rows += table.column("group_id").to_pylist()
    assert len(rows) == 32 and len(set(rows)) == 8
    # Tool-like waits overlapped generation: the engine kept working while episodes waited on the env.
    overlapping = sum(1 for g0, g1 in generations for w0, w1 in SlowScoringEnv.waits if g0 < w1 and w0 < g1)
    assert overlapping > 0


def test_a_thousand_weight_swaps_under_full_concurrency_finish_without_deadlock(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    model = Decoder(MODEL_CFG, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)

    class EverNewer:
        """Every look at LATEST finds a newer version (a trainer far faster than any real one)."""

        def __init__(self) -> None:
            self.version = 0

        def latest(self) -> int:
            self.version += 1
            return self.version

        def load(self, version: int):
            return params

    source = EverNewer()

    async def main():
        async with JaxEngine(model, ENGINE_CFG) as engine:
            orch = Orchestrator(config=RolloutConfig(group_size=4, max_concurrency=16, eta=0, weight_poll_s=0.001,
                                                      stop_poll_s=0.05),
                                engine=engine, episode_fn=make_episode_fn(engine, []), tasks=tasks(), weights=source,
                                writer=ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=4)),
                                should_stop=lambda: orch.stats.weight_swaps >= 1000)
            stats = await asyncio.wait_for(orch.run(), 300)
            return stats, engine.policy_version

    stats, engine_version = asyncio.run(main())
    assert stats.weight_swaps >= 1000 and engine_version >= 1000
    assert stats.groups_committed == stats.groups_started
    for v in store.list("trajectories"):
        for name in store.list(f"trajectories/{v}"):
            table, _ = read_shard(store, f"trajectories/{v}/{name}")
            for versions, mask in zip(table.column("policy_version").to_pylist(),
                                      table.column("loss_mask").to_pylist(), strict=True):
                stamped = [x for x, m in zip(versions, mask, strict=True) if m]
                assert stamped == sorted(stamped)  # versions only move forward within a trajectory
