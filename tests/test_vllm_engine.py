"""The vLLM backend against a real vLLM (CPU) server started from ``.venv-vllm`` on 127.0.0.1.

One server per test session (module fixture ``server``); every test drives it through its own ``VllmEngine``,
which first makes the server serve the folder the test asks for (the slow preemption test launches its own, with
128 slots and a small KV cache). Weights are the tiny preset, exported with
``hf_export`` from two random initialisations (v0 and v1), tied embeddings: the case where a plain vLLM reload
on CPU leaves the output layer stale (untied weights: the campaign of ``test_vllm_campaign.py``, marked slow, and of
``make bench``'s ``vllm``).

Tolerance: vLLM's float32 CPU kernels and XLA's differ by rounding only; logprobs agree within 1e-4
(observed ~2e-6) and greedy completions are identical.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import signal
from pathlib import Path

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bench.vllm import EAGER
from pipelines_lib.agents import make_agent, run_episode
from pipelines_lib.agents.base import AgentConfig
from pipelines_lib.engine import JaxEngine
from pipelines_lib.engine.api import Completion, SamplingParams
from pipelines_lib.engine.config import EngineConfig, VllmConfig
from pipelines_lib.engine.vllm_engine import VllmEngine
from pipelines_lib.engine.vllm_supervisor import VllmServer, default_python
from pipelines_lib.envs import make_env
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_export import save_hf_checkpoint
from pipelines_lib.model.tokenizer import ensure_default_tokenizer, load_tokenizer

LOGPROB_TOLERANCE = 1e-4
MAX_SEQ_LEN = 192
PROMPTS = [[1, 5, 9, 33, 100], [7] * 40, list(range(3, 60, 2))]
MODELS = {seed: Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(seed)) for seed in (0, 1)}
"""v0 and v1: two random initialisations of the tiny preset (tied embeddings)."""


def vllm_python() -> Path:
    """``ROLLSTREAM_VLLM_PYTHON`` (set by ``make test``, which builds the virtualenv: missing is a failure), else the
    repository's ``.venv-vllm`` (missing: skipped, run ``make vllm-venv``)."""
    required = os.environ.get("ROLLSTREAM_VLLM_PYTHON")
    python = Path(required) if required else default_python()
    if not python.exists():
        if required:
            pytest.fail(f"ROLLSTREAM_VLLM_PYTHON={required} does not exist")
        pytest.skip(f"no vLLM virtualenv at {python} (make vllm-venv)")
    return python


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    tokenizer = ensure_default_tokenizer()
    out = {f"v{seed}": save_hf_checkpoint(model, root / f"v{seed}", tokenizer_dir=tokenizer)
           for seed, model in MODELS.items()}
    broken = root / "broken"  # a publication whose weights file is cut short
    shutil.copytree(out["v1"], broken)
    (broken / "model.safetensors").write_bytes((out["v1"] / "model.safetensors").read_bytes()[:1000])
    return {**out, "broken": broken}


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    config = VllmConfig(python=str(vllm_python()), max_num_seqs=16, extra_args=EAGER)
    srv = VllmServer(config, max_model_len=MAX_SEQ_LEN, log_path=tmp_path_factory.mktemp("vllm") / "server.log",
                     log=lambda _: None)
    asyncio.run(srv.start(folders["v0"]))
    yield srv
    asyncio.run(srv.stop())


def engine_on(server: VllmServer, folder: Path, version: int, logs: list[str] | None = None,
              **config: object) -> VllmEngine:
    return VllmEngine(dataclasses.replace(server.config, **config), model_dir=folder, policy_version=version,
                      max_seq_len=MAX_SEQ_LEN, server=server, log=(logs if logs is not None else []).append)


PAD_TO = 64


@nnx.jit
def _logprobs_at(model: Decoder, tokens_1t: jax.Array, last: jax.Array, temperature: jax.Array) -> jax.Array:
    """``log_softmax(logits / T)`` after position ``last`` (inputs padded to one length: one compilation)."""
    return jax.nn.log_softmax(model(tokens_1t)[0, last] / temperature)


def jax_logprobs(seed: int, ids: list[int], temperature: float = 1.0) -> np.ndarray:
    """Log-probs over the vocabulary of the token after ``ids`` under the seed's model (causal: padding is unseen)."""
    padded = jnp.asarray([ids + [0] * (PAD_TO - len(ids))])
    return np.asarray(_logprobs_at(MODELS[seed], padded, jnp.asarray(len(ids) - 1), jnp.asarray(temperature)))


def jax_reference(seed: int, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation of ``prompt`` and its per-token logprobs, by full forward passes."""
    ids, lps = list(prompt), []
    for _ in range(steps):
        logp = jax_logprobs(seed, ids)
        ids.append(int(np.argmax(logp)))
        lps.append(float(logp[ids[-1]]))
    return ids[len(prompt):], lps



def test_greedy_completions_equal_the_jax_engines_and_logprobs_agree(server: VllmServer,
                                                                     folders: dict[str, Path]) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)

    async def main() -> tuple[list[Completion], list[Completion]]:
        async with engine_on(server, folders["v0"], 0) as vllm, JaxEngine(
                MODELS[0],
                EngineConfig(num_slots=4, max_seq_len=MAX_SEQ_LEN, prefill_buckets=(16, 64))) as jax_engine:
            ours = await asyncio.gather(*(vllm.generate(p, greedy) for p in PROMPTS))
            reference = await asyncio.gather(*(jax_engine.generate(p, greedy) for p in PROMPTS))
            return list(ours), list(reference)

    ours, reference = asyncio.run(main())
    for prompt, got, want in zip(PROMPTS, ours, reference, strict=True):
        assert got.policy_versions == [0] * 12 and got.finish_reason == "length"
        same = next((i for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids, strict=True)) if a != b), 12)
        np.testing.assert_allclose(got.logprobs[:same], want.logprobs[:same], atol=LOGPROB_TOLERANCE)
        if same < 12:  # a random tiny model has near-ties: the two picks may differ only where the logits tie
            logp = jax_logprobs(0, prompt + want.token_ids[:same])
            assert abs(float(logp[got.token_ids[same]] - logp[want.token_ids[same]])) <= LOGPROB_TOLERANCE


def test_sampled_logprobs_are_after_temperature(server: VllmServer, folders: dict[str, Path]) -> None:
    """``processed_logprobs``: the logprob of a token sampled at T = 0.5 is ``log_softmax(logits / 0.5)``."""
    prompt = PROMPTS[0]

    async def main() -> Completion:
        async with engine_on(server, folders["v0"], 0) as vllm:
            return await vllm.generate(prompt, SamplingParams(temperature=0.5, max_new_tokens=8, seed=3))

    got = asyncio.run(main())
    want = [jax_logprobs(0, prompt + got.token_ids[:i], 0.5)[token] for i, token in enumerate(got.token_ids)]
    np.testing.assert_allclose(got.logprobs, want, atol=LOGPROB_TOLERANCE)


IN_FLIGHT = 128


def seeded_load(n: int, prompt_len: int, new_tokens: int) -> list[tuple[list[int], SamplingParams]]:
    """``n`` seeded requests, each sent twice (the second copy ``n // 2`` later): distinct prompts of
    ``prompt_len`` tokens, seed = index."""
    half = [([3 + (7 * i + j) % 500 for j in range(prompt_len)],
             SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i)) for i in range(n // 2)]
    return half + half


async def serve_seeded_load(vllm: VllmEngine, load: list[tuple[list[int], SamplingParams]]) -> list[Completion]:
    started = [asyncio.create_task(vllm.generate(prompt, sampling)) for prompt, sampling in load]
    while vllm.stats()["busy_s"] == 0.0:
        await asyncio.sleep(0)
    assert vllm._in_flight == len(load)  # all of them on the server at once
    return list(await asyncio.gather(*started))


def assert_served_as_seeded(load: list[tuple[list[int], SamplingParams]], completions: list[Completion],
                            stats: dict[str, float]) -> None:
    """Every request got all its tokens, no server failed, and the two copies of each request (the same prompt
    and seed, in different batches) sampled the same tokens."""
    assert stats["failed_requests"] == stats["restarts"] == 0
    assert all(len(c.token_ids) == s.max_new_tokens and c.finish_reason == "length"
               for (_, s), c in zip(load, completions, strict=True))
    half = len(completions) // 2
    for first, second in zip(completions[:half], completions[half:], strict=True):
        assert first.token_ids == second.token_ids
        np.testing.assert_allclose(first.logprobs, second.logprobs, atol=LOGPROB_TOLERANCE)
    assert len({tuple(c.token_ids) for c in completions[:half]}) > half // 2  # the seeds differ, so do the samples


def test_128_seeded_requests_in_flight_are_all_served_as_seeded(server: VllmServer,
                                                                 folders: dict[str, Path]) -> None:
    """Prompts of 150 tokens: the 16 requests one step admits hold more than vLLM's default step budget (2048
    tokens), so a server that chunks prefills would split one, and rewinding that request's seeded sampler kills
    a CPU server."""
    load = seeded_load(IN_FLIGHT, prompt_len=150, new_tokens=4)

    async def main() -> tuple[list[Completion], dict[str, float]]:
        async with engine_on(server, folders["v0"], 0) as vllm:
            return await serve_seeded_load(vllm, load), vllm.stats()

    completions, stats = asyncio.run(main())
    assert_served_as_seeded(load, completions, stats)
    assert server.alive()


@pytest.mark.slow
def test_128_seeded_requests_decoded_together_survive_preemption(folders: dict[str, Path],
                                                                tmp_path: Path) -> None:
    """128 slots and a KV cache of 24 blocks (128 tokens each): decodes crossing a block boundary preempt others,
    which are recomputed later, and every request still samples its own seeded stream."""
    config = VllmConfig(python=str(vllm_python()), max_num_seqs=IN_FLIGHT,
                        extra_args=(*EAGER, "--num-gpu-blocks-override", "24"))
    load = seeded_load(IN_FLIGHT, prompt_len=120, new_tokens=16)

    async def main() -> tuple[list[Completion], dict[str, float], str]:
        async with VllmEngine(config, model_dir=folders["v0"], policy_version=0, max_seq_len=MAX_SEQ_LEN,
                              log_path=tmp_path / "server.log", log=lambda _: None) as vllm:
            completions = await serve_seeded_load(vllm, load)
            async with httpx.AsyncClient(base_url=vllm.server.url) as client:
                metrics = (await client.get("/metrics")).text
            return completions, vllm.stats(), metrics

    completions, stats, metrics = asyncio.run(main())
    assert_served_as_seeded(load, completions, stats)
    preemptions = re.search(r"^vllm:num_preemptions_total\{.*\} (\S+)$", metrics, re.MULTILINE)
    assert preemptions and float(preemptions.group(1)) > 0


class Recording:
    """Passes calls to an engine and keeps what went in and came out."""

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[list[int], Completion]] = []

    policy_version = property(lambda self: self.engine.policy_version)
    max_seq_len = property(lambda self: self.engine.max_seq_len)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        completion = await self.engine.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), completion))
        return completion

    def swap_weights(self, params: object, version: int) -> object:
        return self.engine.swap_weights(params, version)


def test_an_episode_records_exactly_the_ids_sent_and_received(server: VllmServer, folders: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(ensure_default_tokenizer())
    env = make_env("arithmetic")
    task = type(env).generate_tasks(seed=0, n=1, split="train")[0]

    async def main():
        async with engine_on(server, folders["v0"], 0) as vllm:
            engine = Recording(vllm)
            trajectory = await run_episode(
                env=env, task=task, agent=make_agent(AgentConfig(), tokenizer), engine=engine, tokenizer=tokenizer,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=24, seed=5), group_id="g", sample_idx=0,
                group_size=1, worker_id="w", episode_timeout_s=120, tool_timeout_s=10, max_tokens=MAX_SEQ_LEN)
            return trajectory, engine.calls

    trajectory, calls = asyncio.run(main())
    assert calls
    for prompt, completion in calls:
        end = len(prompt) + len(completion.token_ids)
        assert trajectory.tokens[:len(prompt)] == prompt
        assert trajectory.tokens[len(prompt):end] == completion.token_ids
        assert trajectory.logprobs[len(prompt):end] == pytest.approx(completion.logprobs)
        assert trajectory.policy_version[len(prompt):end] == [0] * len(completion.token_ids)
        assert all(trajectory.loss_mask[len(prompt):end])
        if completion.finish_reason == "stop":
            assert completion.token_ids[-1] in tokenizer.stop_ids


def test_a_reload_serves_the_new_version_and_stamps_it_tied_embeddings(server: VllmServer,
                                                                       folders: dict[str, Path]) -> None:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)

    async def main() -> tuple[Completion, Completion, dict[str, float]]:
        async with engine_on(server, folders["v0"], 0) as vllm:
            before = await vllm.generate(PROMPTS[0], greedy)
            await vllm.swap_weights(folders["v1"], 1)
            after = await vllm.generate(PROMPTS[0], greedy)
            return before, after, vllm.stats()

    before, after, stats = asyncio.run(main())
    assert before.token_ids == jax_reference(0, PROMPTS[0], 10)[0]
    want_ids, want_lps = jax_reference(1, PROMPTS[0], 10)
    assert after.token_ids == want_ids
    np.testing.assert_allclose(after.logprobs, want_lps, atol=LOGPROB_TOLERANCE)
    assert (before.policy_versions, after.policy_versions) == ([0] * 10, [1] * 10)
    assert stats["weight_syncs"] == 1 and stats["weight_sync_s"] > 0


def test_a_failed_reload_keeps_the_old_version_and_says_so(server: VllmServer, folders: dict[str, Path]) -> None:
    logs: list[str] = []
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)

    async def main() -> tuple[Completion, VllmEngine]:
        async with engine_on(server, folders["v0"], 0, logs) as vllm:
            await vllm.swap_weights(folders["broken"], 1)
            return await vllm.generate(PROMPTS[0], greedy), vllm

    completion, vllm = asyncio.run(main())
    assert vllm.policy_version == 0 and vllm.stats()["reload_failures"] == 1
    assert completion.token_ids == jax_reference(0, PROMPTS[0], 10)[0]
    assert completion.policy_versions == [0] * 10
    assert any("reload to v1" in line and "failed" in line and "keeping v0" in line for line in logs)


def test_abort_mode_continues_in_flight_requests_on_the_new_weights(server: VllmServer,
                                                                    folders: dict[str, Path]) -> None:
    """Requests in flight during an abort-mode reload still return all their tokens; each token keeps the
    version that produced it (old versions first)."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=150, seed=1)

    async def main() -> tuple[list[Completion], dict[str, float]]:
        async with engine_on(server, folders["v0"], 0, in_flight_on_reload="abort") as vllm:
            tasks = [asyncio.create_task(vllm.generate([1, 2, 3 + i], sampling)) for i in range(8)]
            while vllm.stats()["busy_s"] == 0.0:  # the requests are on the server
                await asyncio.sleep(0)
            await vllm.swap_weights(folders["v1"], 1)
            return list(await asyncio.gather(*tasks)), vllm.stats()

    completions, stats = asyncio.run(main())
    for c in completions:
        assert c.policy_versions == sorted(c.policy_versions) and set(c.policy_versions) <= {0, 1}
        assert len(c.token_ids) == len(c.logprobs) == len(c.policy_versions) == 150
    # Whether a request is cut mid-generation depends on timing (it may not have reached the server before the
    # pause); a request that ran on both versions must have been cut by the reload.
    assert sum(0 in c.policy_versions and 1 in c.policy_versions for c in completions) <= stats["aborted_requests"]
    assert stats["weight_syncs"] == 1


# A real vLLM server killed and restarted (about 50 s): `make test-all`; test_vllm_supervision covers the restart logic
# against a crashing stand-in server in the default suite.
@pytest.mark.slow
def test_a_server_killed_mid_episode_fails_those_episodes_and_is_restarted(server: VllmServer,
                                                                           folders: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(ensure_default_tokenizer())
    tasks = type(make_env("arithmetic")).generate_tasks(seed=0, n=4, split="train")

    async def episode(engine: VllmEngine, i: int):
        return await run_episode(
            env=make_env("arithmetic"), task=tasks[i], agent=make_agent(AgentConfig(), tokenizer), engine=engine,
            tokenizer=tokenizer, sampling=SamplingParams(temperature=1.0, max_new_tokens=40, seed=i),
            group_id=f"g{i}", sample_idx=0, group_size=1, worker_id="w", episode_timeout_s=600, tool_timeout_s=10,
            max_tokens=MAX_SEQ_LEN)

    async def main():
        async with engine_on(server, folders["v0"], 0) as vllm:
            running = [asyncio.create_task(episode(vllm, i)) for i in range(3)]
            while vllm.stats()["busy_s"] == 0.0:
                await asyncio.sleep(0)
            os.killpg(server.proc.pid, signal.SIGKILL)
            killed = await asyncio.gather(*running)
            after = await episode(vllm, 3)  # waits for the restart
            return killed, after, vllm.stats()

    killed, after, stats = asyncio.run(main())
    assert "engine_error" in {t.status for t in killed}
    assert after.status != "engine_error" and stats["restarts"] == 1 and server.alive()
