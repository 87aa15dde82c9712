"""A real multi-turn tool episode on the real decoder and continuous-batching engine.

An untrained model never writes a tool call, so the model first memorises one demonstration of the arithmetic
task (60 SFT steps on that one conversation, a few seconds on CPU): greedy decoding then writes the tool call,
the real calculator answers, and the second turn, conditioned on the tool's tokens, writes the answer. Two
samples share the engine concurrently. Beyond the turn structure and the reward, the recorded logprobs of every
generated token equal the log-softmax of one plain full forward pass over the recorded token list: the trainer's
view of the sequence (tool tokens included) is exactly what the policy conditioned on while sampling.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pipelines_lib.agents import AgentConfig, make_agent, run_episode
from pipelines_lib.config import SFTConfig
from pipelines_lib.engine import Completion, EngineConfig, JaxEngine, SamplingParams
from pipelines_lib.envs import env_class, make_env
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ensure_default_tokenizer, load_tokenizer
from pipelines_lib.train.optim import OptimConfig
from pipelines_lib.train.sft import demonstration_rows, sft_train
from pipelines_lib.trajectory.record import Trajectory, to_table
from pipelines_lib.trajectory.validate import validate_table

# The tiny model's vocabulary and context with the other dimensions shrunk: memorising one conversation needs
# little capacity, and small matrices compile fast.
SMALL = dataclasses.replace(ModelConfig.tiny(), d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32,
                            d_ff=128)
MEMORISE = SFTConfig(n_demos=1, steps=60, batch_size=1,
                     optim=OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", total_steps=60, weight_decay=0.0))


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


def test_tool_call_episode_on_the_real_engine_runs_the_calculator_and_logprobs_match_a_full_forward() -> None:
    tok = load_tokenizer(ensure_default_tokenizer())
    assert tok.vocab_size <= SMALL.vocab_size
    model = Decoder(SMALL, rngs=nnx.Rngs(0))
    task = env_class("arithmetic").generate_tasks(seed=0, n=1, split="train")[0]
    rows = demonstration_rows(EnvSpec(name="arithmetic"), tok, n=1, error_rate=0.0, seed=0, with_tools=True)
    sft_train(model, rows, MEMORISE, pad_id=tok.pad_id, log=lambda _: None)

    async def main() -> tuple[list[Trajectory], list[list[int]]]:
        config = EngineConfig(num_slots=2, max_seq_len=SMALL.max_seq_len, prefill_buckets=(256,))
        async with JaxEngine(model, config) as jax_engine:
            engine = RecordingEngine(jax_engine)
            episodes = [
                run_episode(
                    env=make_env("arithmetic"), task=task, agent=make_agent(AgentConfig(), tok), engine=engine,
                    tokenizer=tok, sampling=SamplingParams(temperature=0.0, max_new_tokens=48, seed=i),
                    group_id="g", sample_idx=i, group_size=2, worker_id="w", episode_timeout_s=120.0,
                    tool_timeout_s=5.0, max_tokens=SMALL.max_seq_len,
                )
                for i in range(2)
            ]
            return list(await asyncio.wait_for(asyncio.gather(*episodes), 120)), engine.prompts

    trajectories, prompts = asyncio.run(main())
    assert validate_table(to_table(trajectories)) == []
    assert len(prompts) == 4  # two turns per episode: the second prompt carries the tool's reply
    for prompt in prompts:
        assert any(list(t.tokens[: len(prompt)]) == prompt for t in trajectories)
    answer = task.answer  # the value of the task's expression, e.g. 8019 for 81*99
    forward = nnx.jit(lambda m, tokens_bt: jax.nn.log_softmax(m(tokens_bt), axis=-1))
    for traj in trajectories:
        assert (traj.status, traj.reward) == ("ok", 1.0)
        assert [(u.role, u.tool_name, u.error) for u in traj.turns] == [
            ("system", None, None), ("user", None, None), ("assistant", None, None),
            ("tool", "calculator", None), ("assistant", None, None)]
        tool = traj.turns[3]
        assert answer in tok.decode(list(traj.tokens[tool.start : tool.end]))  # the calculator's real output
        assert set(traj.loss_mask[tool.start : tool.end]) == {0}
        assert set(traj.policy_version[tool.start : tool.end]) == {-1}
        assert f"<answer>{answer}</answer>" in tok.decode(list(traj.tokens[traj.turns[4].start : traj.turns[4].end]))
        assert traj.tokenizer_hash == tok.tokenizer_hash
        # Right-padding to one length (causal attention ignores it) compiles the forward pass once.
        padded = list(traj.tokens) + [tok.pad_id] * (SMALL.max_seq_len - len(traj.tokens))
        logp_tv = np.asarray(forward(model, jnp.asarray([padded], jnp.int32))[0])
        positions = [t for t, m in enumerate(traj.loss_mask) if m]
        assert any(p > tool.end for p in positions)  # the second turn's tokens are checked too
        expected = [logp_tv[t - 1, traj.tokens[t]] for t in positions]
        np.testing.assert_allclose([traj.logprobs[t] for t in positions], expected, atol=2e-5)
