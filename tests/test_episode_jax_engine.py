"""A real episode on the real tiny decoder and continuous-batching engine (untrained, so validity only).

Two samples of one arithmetic task share the engine concurrently. Beyond schema validity, the recorded
logprobs of every generated token equal the log-softmax of one plain full forward pass over the recorded
token list: the trainer's view of the sequence is exactly what the policy conditioned on while sampling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.engine import Completion, EngineConfig, JaxEngine, SamplingParams
from pipelines_lib.envs import make_env
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ensure_default_tokenizer, load_tokenizer
from pipelines_lib.trajectory.record import Trajectory, to_table
from pipelines_lib.trajectory.validate import validate_table


class RecordingEngine:
    """Delegates to the real engine and keeps every prompt it was given."""

    def __init__(self, inner: JaxEngine) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def max_seq_len(self) -> int:
        return self.inner.max_seq_len

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_ids))
        return await self.inner.generate(prompt_ids, sampling)

    def swap_weights(self, params: object, version: int) -> None:
        self.inner.swap_weights(params, version)


@pytest.mark.slow  # ~30 s on 2 shared CPU cores: model init and three compilations
def test_real_tiny_model_episode_is_valid_and_logprobs_match_a_full_forward() -> None:
    tok = load_tokenizer(ensure_default_tokenizer())
    cfg = ModelConfig.tiny()
    assert tok.vocab_size <= cfg.vocab_size
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    env_name = "arithmetic"
    task = type(make_env(env_name)).generate_tasks(seed=0, n=1, split="train")[0]

    async def main() -> list[Trajectory]:
        async with JaxEngine(model, EngineConfig(num_slots=2, max_seq_len=cfg.max_seq_len, prefill_buckets=(256,))) as jax_engine:
            engine = RecordingEngine(jax_engine)
            episodes = [
                run_episode(
                    env=make_env(env_name), task=task, agent=make_agent(AgentConfig(), tok), engine=engine,
                    tokenizer=tok, sampling=SamplingParams(temperature=0.0, max_new_tokens=24, seed=i),
                    group_id="g", sample_idx=i, group_size=2, worker_id="w", episode_timeout_s=120.0,
                    tool_timeout_s=5.0, max_tokens=cfg.max_seq_len,
                )
                for i in range(2)
            ]
            trajectories = await asyncio.gather(*episodes)
            for prompt in engine.prompts:
                assert any(list(t.tokens[: len(prompt)]) == prompt for t in trajectories)
            return trajectories

    trajectories = asyncio.run(main())
    assert validate_table(to_table(trajectories)) == []
    # Right-padding to one length (causal attention ignores it) compiles the forward pass once.
    forward = nnx.jit(lambda m, tokens_bt: jax.nn.log_softmax(m(tokens_bt), axis=-1))
    for traj in trajectories:
        assert traj.status in ("ok", "max_tokens", "max_turns")
        assert len(traj.tokens) <= cfg.max_seq_len and sum(traj.loss_mask) > 0
        assert traj.tokenizer_hash == tok.tokenizer_hash
        padded = list(traj.tokens) + [tok.pad_id] * (cfg.max_seq_len - len(traj.tokens))
        logp_tv = np.asarray(forward(model, jnp.asarray([padded], jnp.int32))[0])
        positions = [t for t, m in enumerate(traj.loss_mask) if m]
        expected = [logp_tv[t - 1, traj.tokens[t]] for t in positions]
        np.testing.assert_allclose([traj.logprobs[t] for t in positions], expected, atol=2e-5)


