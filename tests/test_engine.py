"""The continuous-batching JAX engine against the plain full forward pass of the same tiny model.

The model's matrices are scaled up (x3) so greedy decoding wanders over the vocabulary instead of
repeating one token, which would make "same tokens" comparisons weak.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pipelines_lib.engine import Engine, EngineClosedError, EngineConfig, JaxEngine, SamplingParams
from pipelines_lib.engine.blocks import BlockPool
from pipelines_lib.engine.device import DeviceRunner, Dispatched, steps_for
from pipelines_lib.engine.roofline import decode_step_bytes
from pipelines_lib.engine.sampling import filtered_logits
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.weights import load_weights, save_weights
from pipelines_lib.publish import CampaignWeights, publish_weights
from pipelines_lib.storage.store import Store

# One decode step a call, as a CPU runs by default, on any backend (an accelerator's default runs several): the
# step and dispatch counts the tests hold are a one-step engine's; MULTI and the tests naming decode_steps run more.
CONFIG = EngineConfig(num_slots=4, max_seq_len=96, prefill_buckets=(16, 32), decode_steps=1)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@functools.cache
def lively_model(seed: int) -> Decoder:
    model = Decoder(ModelConfig.tiny(), rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 3.0 if x.ndim == 2 else x, params))
    return model


@pytest.fixture(scope="module")
def model() -> Decoder:
    return lively_model(0)


def run(model: Decoder, body: Callable[[JaxEngine], Awaitable[Any]], config: EngineConfig = CONFIG) -> Any:
    async def main() -> Any:
        async with JaxEngine(model, config) as engine:
            await engine.warmup()
            return await asyncio.wait_for(body(engine), timeout=120)  # a broken engine fails, not hangs

    return asyncio.run(main())


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the engine until ``condition`` holds (``run`` bounds the whole body's time)."""
    while not condition():
        await asyncio.sleep(0.001)


@nnx.jit
def _forward(model: Decoder, tokens_bt: jax.Array) -> jax.Array:
    return model(tokens_bt)


def full_forward_logits(model: Decoder, sequence: list[int]) -> np.ndarray:
    """No-cache logits, right-padded to one fixed length so the reference compiles once."""
    padded = np.zeros((1, CONFIG.max_seq_len), np.int32)
    padded[0, : len(sequence)] = sequence
    return np.asarray(_forward(model, jnp.asarray(padded))[0, : len(sequence)])


def prompt(length: int, offset: int = 0) -> list[int]:
    return [(7 * i + 3 + offset) % 500 + 1 for i in range(length)]


# Prefill covers all but the last prompt token: 4 (padded to 16), 16 (exactly a bucket), 44 (32 + 12).
@pytest.mark.parametrize("prompt_len", [5, 17, 45])
def test_greedy_tokens_and_logprobs_equal_full_forward_argmax(model: Decoder, prompt_len: int) -> None:
    ids = prompt(prompt_len)
    completion = run(model, lambda e: e.generate(ids, GREEDY))
    sequence = ids + completion.token_ids
    logits = full_forward_logits(model, sequence)
    positions = range(prompt_len - 1, len(sequence) - 1)
    assert completion.token_ids == [int(np.argmax(logits[p])) for p in positions]
    expected = [
        float(jax.nn.log_softmax(logits[p])[t]) for p, t in zip(positions, completion.token_ids, strict=True)
    ]
    np.testing.assert_allclose(completion.logprobs, expected, rtol=0, atol=1e-4)
    assert completion.finish_reason == "length" and completion.policy_versions == [0] * 12
    assert len(set(completion.token_ids)) > 3


def test_sampled_logprobs_are_under_the_filtered_distribution(model: Decoder) -> None:
    ids = prompt(9)
    sampling = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, max_new_tokens=8, seed=3)
    completion = run(model, lambda e: e.generate(ids, sampling))
    logits = full_forward_logits(model, ids + completion.token_ids)
    for i, (token, logprob) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        filtered = filtered_logits(
            jnp.asarray(logits[None, len(ids) - 1 + i]), *map(jnp.asarray, ([0.7], [20], [0.8]))
        )
        assert np.isfinite(filtered[0, token])
        np.testing.assert_allclose(logprob, jax.nn.log_softmax(filtered[0])[token], rtol=0, atol=1e-4)


def test_seeded_request_is_independent_of_batch_composition(model: Decoder) -> None:
    target = (prompt(11), SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=20, seed=42))
    others = [
        (prompt(3 + 9 * k, k), SamplingParams(temperature=1.0, max_new_tokens=5 + 7 * k, seed=k))
        for k in range(5)
    ]

    async def alone(engine: JaxEngine) -> Any:
        return await engine.generate(*target)

    async def crowded(engine: JaxEngine) -> Any:
        early = [asyncio.create_task(engine.generate(*o)) for o in others[:3]]
        await until(lambda: engine.stats()["generated_tokens"] >= 3)  # the target joins a batch already decoding
        results = await asyncio.gather(
            engine.generate(*target), *[engine.generate(*o) for o in others[3:]], *early
        )
        return results[0]

    a, b = run(model, alone), run(model, crowded)
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)  # other batch sizes round differently
    other_seed = run(
        model, lambda e: e.generate(target[0], SamplingParams(temperature=1.0, max_new_tokens=20, seed=43))
    )
    assert other_seed.token_ids != a.token_ids


def test_no_compilation_after_warmup(model: Decoder, tmp_path) -> None:
    save_weights(lively_model(1), str(tmp_path / "v1"))

    async def body(engine: JaxEngine) -> tuple[int, int]:
        before = engine.stats()["compilations"]
        requests = [
            (prompt(n, n), SamplingParams(temperature=t, top_k=k, max_new_tokens=m, seed=n))
            for n, t, k, m in [
                (1, 0.0, 0, 3),
                (17, 1.0, 5, 9),
                (40, 0.5, 0, 14),
                (70, 1.3, 50, 6),
                (8, 0.0, 0, 20),
            ]
        ]
        await asyncio.gather(*[engine.generate(*r) for r in requests])
        engine.swap_weights(load_weights(str(tmp_path / "v1")), 1)  # as a rollout worker refreshes
        await engine.generate(prompt(5), GREEDY)
        return before, engine.stats()["compilations"]

    before, after = run(model, body)
    assert after == before


def test_swap_under_load_keeps_requests_alive_and_stamps_versions(model: Decoder) -> None:
    new_model = lively_model(1)

    async def body(engine: JaxEngine) -> list[Any]:
        tasks = [
            asyncio.create_task(
                engine.generate(prompt(4 + 5 * k, k), SamplingParams(temperature=0.0, max_new_tokens=40))
            )
            for k in range(6)  # more requests than slots: two join after the swap
        ]
        await until(lambda: engine.stats()["generated_tokens"] >= 20)
        engine.swap_weights(new_model, 7)
        assert engine.policy_version == 7
        return await asyncio.gather(*tasks)

    completions = run(model, body)
    assert all(c.finish_reason == "length" and len(c.token_ids) == 40 for c in completions)
    for c in completions:  # a run of 0s then a run of 7s
        assert c.policy_versions == sorted(c.policy_versions)
        assert set(c.policy_versions) <= {0, 7}
    assert any(set(c.policy_versions) == {0, 7} for c in completions)
    late = [c for c in completions if c.policy_versions[0] == 7]
    assert late, "requests admitted after the swap see only the new weights"
    # Tokens after the swap come from the new weights: a fully new-weights request matches a plain greedy run.
    c = late[0]
    k = completions.index(c)
    solo = run(
        new_model,
        lambda e: e.generate(prompt(4 + 5 * k, k), SamplingParams(temperature=0.0, max_new_tokens=40)),
    )
    assert solo.token_ids == c.token_ids


def test_orbax_load_in_a_thread_races_full_slots_and_every_token_carries_the_weights_that_made_it(
    model: Decoder, tmp_path
) -> None:
    """The rollout worker's path: version 1 is published (Orbax) and loaded from the campaign in a thread while
    twice as many greedy requests as slots keep the engine saturated; the loading thread installs it.

    Each client resubmits its own prompt until one of its requests was submitted after the swap. Greedy
    tokens of the two weight sets differ, so a token stamped with the wrong version, or weights installed in
    the middle of a step, would break the comparison with solo runs of each version."""
    store = Store(str(tmp_path / "c"))
    clients = 2 * CONFIG.num_slots
    requests = [(prompt(4 + 5 * k, k), SamplingParams(temperature=0.0, max_new_tokens=24)) for k in range(clients)]

    def publish_load_and_swap(engine: JaxEngine) -> None:
        publish_weights(store, lively_model(1), version=1, step=2)
        engine.swap_weights(CampaignWeights(store).load(1), 1)

    async def body(engine: JaxEngine) -> tuple[list[tuple[int, bool, Any]], int]:
        loader: asyncio.Task | None = None
        runs: list[tuple[int, bool, Any]] = []  # (client, submitted after the swap returned, completion)

        async def client(k: int) -> None:
            while True:
                after_swap = loader is not None and loader.done()
                runs.append((k, after_swap, await engine.generate(*requests[k])))
                if after_swap:
                    return

        clients_done = asyncio.gather(*[client(k) for k in range(clients)])
        await until(lambda: engine.stats()["generated_tokens"] >= clients)  # all slots decode before the load
        loader = asyncio.create_task(asyncio.to_thread(publish_load_and_swap, engine))
        await loader
        await clients_done
        return runs, engine.policy_version

    runs, version = run(model, body)
    solo = {v: run(m, lambda e: asyncio.gather(*[e.generate(*r) for r in requests]))
            for v, m in ((0, model), (1, lively_model(1)))}
    assert version == 1
    for k, after_swap, c in runs:
        assert len(c.token_ids) == 24 and c.policy_versions == sorted(c.policy_versions)
        n_old = c.policy_versions.count(0)
        assert n_old + c.policy_versions.count(1) == 24
        if after_swap:
            assert n_old == 0
        # Tokens stamped 0 are exactly what the old weights generate; a request wholly on version 1 is exactly
        # what the published weights generate (tokens after a mid-request swap attend to old keys/values).
        assert c.token_ids[:n_old] == solo[0][k].token_ids[:n_old]
        np.testing.assert_allclose(c.logprobs[:n_old], solo[0][k].logprobs[:n_old], rtol=0, atol=1e-4)
        if n_old == 0:
            assert c.token_ids == solo[1][k].token_ids
    assert solo[0][0].token_ids != solo[1][0].token_ids
    assert any(0 in c.policy_versions for _, _, c in runs)  # requests decoding on v0 while the load ran


def test_swap_rejects_mismatched_weights(model: Decoder) -> None:
    engine = JaxEngine(model, CONFIG)
    other = Decoder(ModelConfig.from_dict({**ModelConfig.tiny().to_dict(), "d_ff": 256}), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"layers/mlp/down_proj/kernel .*\[4, 256, 128\].*\[4, 384, 128\]"):
        engine.swap_weights(other, 1)
    assert engine.policy_version == 0


def test_stop_id_ends_generation_and_is_included(model: Decoder) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    free = run(model, lambda e: e.generate(prompt(6), sampling))
    stop = next(t for i, t in enumerate(free.token_ids) if i >= 4 and t not in free.token_ids[:i])
    cut = free.token_ids.index(stop) + 1
    stopped = run(
        model, lambda e: e.generate(prompt(6), SamplingParams(**{**vars(sampling), "stop_ids": (stop, 9999)}))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut]


def test_max_new_tokens_and_context_limits(model: Decoder) -> None:
    async def body(engine: JaxEngine) -> list[Any]:
        return await asyncio.gather(
            engine.generate(prompt(10), SamplingParams(temperature=0.0, max_new_tokens=1)),
            engine.generate(prompt(90), SamplingParams(temperature=0.0, max_new_tokens=50)),
            engine.generate(prompt(95), SamplingParams(temperature=0.0, max_new_tokens=50)),
            engine.generate(prompt(96), SamplingParams(temperature=0.0, max_new_tokens=50)),
        )

    one, near, last, full = run(model, body)
    assert (one.finish_reason, len(one.token_ids)) == ("length", 1)
    assert (near.finish_reason, len(near.token_ids)) == ("context", 6)  # 90 + 6 = max_seq_len 96
    assert (last.finish_reason, len(last.token_ids)) == ("context", 1)
    assert (full.finish_reason, full.token_ids, full.policy_version) == ("context", [], -1)


def test_static_and_continuous_modes_give_the_same_greedy_tokens(model: Decoder) -> None:
    requests = [
        (prompt(3 + 7 * k, k), SamplingParams(temperature=0.0, max_new_tokens=4 + 5 * k)) for k in range(7)
    ]

    async def body(engine: JaxEngine) -> tuple[list[Any], dict[str, float]]:
        completions = await asyncio.gather(*[engine.generate(*r) for r in requests])
        return completions, engine.stats()

    static_cfg = EngineConfig(**{**vars(CONFIG), "mode": "static"})
    cont, cont_stats = run(model, body)
    static, static_stats = run(model, body, static_cfg)
    assert [c.token_ids for c in cont] == [c.token_ids for c in static]
    assert [len(c.token_ids) for c in cont] == [r[1].max_new_tokens for r in requests]
    # Static waits for each batch's longest request: batches {0..3}, {4..6} -> 19 + 34 steps.
    assert static_stats["decode_steps"] == 19 + 34
    assert cont_stats["decode_steps"] < static_stats["decode_steps"]
    assert (
        cont_stats["generated_tokens"] == static_stats["generated_tokens"] == sum(4 + 5 * k for k in range(7))
    )


def test_event_loop_keeps_running_while_engine_computes(model: Decoder, monkeypatch) -> None:
    """Each compute step waits, in its worker thread, for a coroutine it schedules on the event loop: a loop
    blocked by compute could not run it (the wait would time out), a free one runs it at once."""
    loop_ran_during_compute: list[bool] = []

    async def body(engine: JaxEngine) -> None:
        loop = asyncio.get_running_loop()
        real_compute = engine._compute

        async def ping() -> None:
            pass

        def gated_compute(*args: Any) -> Any:
            probe = asyncio.run_coroutine_threadsafe(ping(), loop)
            try:
                probe.result(timeout=10)
                loop_ran_during_compute.append(True)
            except concurrent.futures.TimeoutError:
                probe.cancel()
                loop_ran_during_compute.append(False)
            return real_compute(*args)

        monkeypatch.setattr(engine, "_compute", gated_compute)
        await engine.generate(prompt(5), SamplingParams(temperature=0.0, max_new_tokens=3))

    run(model, body)
    assert len(loop_ran_during_compute) >= 3 and all(loop_ran_during_compute)


def test_close_fails_pending_requests_and_refuses_new_ones(model: Decoder) -> None:
    async def main() -> None:
        engine = JaxEngine(model, CONFIG)
        await engine.warmup()
        tasks = [
            asyncio.create_task(engine.generate(prompt(5), SamplingParams(max_new_tokens=60)))
            for _ in range(8)
        ]
        # Four requests decoding, four queued; none can finish its 60 tokens before close() stops the scheduler.
        await until(lambda: engine.stats()["generated_tokens"] >= CONFIG.num_slots)
        await engine.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, EngineClosedError) for r in results)
        with pytest.raises(EngineClosedError):
            await engine.generate(prompt(5), GREEDY)

    asyncio.run(main())


def test_compute_failure_reaches_every_waiting_request(model: Decoder, monkeypatch) -> None:
    async def main() -> None:
        engine = JaxEngine(model, CONFIG)

        def device_lost(*args: object) -> None:
            raise RuntimeError("device lost")

        monkeypatch.setattr(engine, "_compute", device_lost)
        results = await asyncio.gather(
            *[engine.generate(prompt(5), GREEDY) for _ in range(6)], return_exceptions=True
        )
        assert all(isinstance(r, EngineClosedError) and "device lost" in str(r) for r in results)
        with pytest.raises(EngineClosedError, match="device lost"):
            await engine.generate(prompt(5), GREEDY)
        await engine.close()

    asyncio.run(main())


def test_cancelled_request_frees_its_slot(model: Decoder) -> None:
    async def body(engine: JaxEngine) -> tuple[Any, list[bool]]:
        long = SamplingParams(temperature=0.0, max_new_tokens=85)
        hogs = [asyncio.create_task(engine.generate(prompt(5, k), long)) for k in range(CONFIG.num_slots)]
        # Cancelled only once every hog holds a slot: a hog cancelled while queued would free nothing.
        await until(lambda: engine.stats()["generated_tokens"] >= CONFIG.num_slots)
        hogs[0].cancel()
        completion = await asyncio.wait_for(engine.generate(prompt(7), GREEDY), timeout=30)
        still_running = [not h.done() for h in hogs[1:]]
        await asyncio.gather(*hogs[1:])
        return completion, still_running

    completion, still_running = run(model, body)
    assert len(completion.token_ids) == 12 and all(still_running)


def test_stats_count_tokens_and_busy_time(model: Decoder) -> None:
    async def body(engine: JaxEngine) -> dict[str, float]:
        engine.reset_stats()
        await asyncio.gather(
            *[
                engine.generate(prompt(8, k), SamplingParams(temperature=0.0, max_new_tokens=10))
                for k in range(4)
            ]
        )
        return engine.stats()

    stats = run(model, body)
    assert stats["generated_tokens"] == 40 and stats["requests_finished"] == 4
    assert stats["decode_steps"] == 10 and stats["active_slot_steps"] == 40 and stats["slot_occupancy"] == 1.0
    assert 0 <= stats["busy_s"] <= stats["wall_s"]
    # Busy time is credited only for steps the host waited on: zero only if every step was ready when read
    # (a loaded host running this tiny model).
    assert stats["busy_s"] > 0 or stats["host_bound_steps"] == stats["decode_steps"]
    assert stats["tokens_per_s"] == pytest.approx(40 / stats["wall_s"])


def test_invalid_prompts_are_rejected(model: Decoder) -> None:
    async def body(engine: JaxEngine) -> None:
        with pytest.raises(ValueError, match="at least one"):
            await engine.generate([], GREEDY)
        with pytest.raises(ValueError, match="512"):
            await engine.generate([1, 512], GREEDY)

    run(model, body)


def test_prefix_reuse_prefills_only_the_new_turn_and_matches_a_fresh_prefill(model: Decoder) -> None:
    turn1 = prompt(30)
    tool_output = prompt(9, 1)

    async def conversation(engine: JaxEngine) -> tuple[list[Any], dict[str, float]]:
        first = await engine.generate(turn1, GREEDY)
        await engine.generate(prompt(30, 2), GREEDY)  # another request in between
        second = await engine.generate(turn1 + first.token_ids + tool_output, GREEDY)
        engine.swap_weights(model, 1)  # same weights, new version: the prefix cache is cleared
        third = await engine.generate(turn1 + first.token_ids + tool_output + second.token_ids, GREEDY)
        return [first, second, third], engine.stats()

    assert CONFIG.prefix_reuse  # on by default
    reused, stats = run(model, conversation)
    fresh, fresh_stats = run(model, conversation, EngineConfig(**{**vars(CONFIG), "prefix_reuse": False}))
    assert [c.token_ids for c in reused] == [c.token_ids for c in fresh]
    np.testing.assert_allclose(reused[1].logprobs, fresh[1].logprobs, rtol=0, atol=1e-4)
    # turn 2 reuses turn 1's prompt and all but its newest completion token: 30 + 12 - 1.
    assert (stats["reused_prefix_tokens"], fresh_stats["reused_prefix_tokens"]) == (41, 0)
    assert fresh_stats["prefill_tokens"] - stats["prefill_tokens"] == 41


def test_a_conversation_finds_its_prefix_after_other_requests_used_its_slot(model: Decoder) -> None:
    """The prefix cache is keyed by tokens, not slots: with one slot, two other requests run between the turns
    and the second turn still prefills only its new tokens, with the tokens of a fresh prefill."""
    config = EngineConfig(num_slots=1, max_seq_len=96, prefill_buckets=(16, 32), num_blocks=24, decode_steps=1)
    turn1 = prompt(40)

    async def body(engine: JaxEngine) -> tuple[Any, dict[str, float], list[int]]:
        first = await engine.generate(turn1, GREEDY)
        for k in (2, 3):
            await engine.generate(prompt(30, k), GREEDY)
        engine.reset_stats()
        turn2 = turn1 + first.token_ids + prompt(9, 1)
        return await engine.generate(turn2, GREEDY), engine.stats(), turn2

    second, stats, turn2 = run(model, body, config)
    assert stats["reused_prefix_tokens"] == 40 + 12 - 1 and stats["prefill_tokens"] == len(turn2) - 51
    # Afterwards all 24 blocks are free and the cache holds every request's tokens but its newest: the second
    # turn read the first's 3 full blocks, adopted its partly filled fourth and cached 72 tokens (5 blocks);
    # the two requests in between cached 41 tokens (3 blocks) each.
    assert (stats["free_blocks"], stats["cached_blocks"]) == (24, 5 + 3 + 3)
    fresh = run(model, lambda e: e.generate(turn2, GREEDY), EngineConfig(**{**vars(config), "prefix_reuse": False}))
    assert second.token_ids == fresh.token_ids
    np.testing.assert_allclose(second.logprobs, fresh.logprobs, rtol=0, atol=1e-4)


def test_concurrent_prompts_read_the_same_cached_blocks_and_match_fresh_prefills(model: Decoder) -> None:
    """Four prompts extending one cached sequence at once: each reads its three full blocks (48 tokens); the
    partly matching fourth block can be written by only one of them, which adopts it (8 more tokens)."""
    base = prompt(56)
    suffixes = [prompt(6, k) for k in range(4)]

    async def body(engine: JaxEngine) -> tuple[list[Any], dict[str, float], list[int]]:
        first = await engine.generate(base, GREEDY)  # caches 56 + 11 tokens: blocks of 16, 16, 16, 16 and 3
        engine.reset_stats()
        completions = await asyncio.gather(*[engine.generate(base + s, GREEDY) for s in suffixes])
        return completions, engine.stats(), first.token_ids

    completions, stats, first_tokens = run(model, body)
    assert all(s[0] != first_tokens[0] for s in suffixes)  # so each shares exactly 56 tokens with the cache
    assert stats["reused_prefix_tokens"] == 56 + 3 * 48
    no_reuse = EngineConfig(**{**vars(CONFIG), "prefix_reuse": False})
    fresh = [run(model, lambda e, s=s: e.generate(base + s, GREEDY), no_reuse) for s in suffixes]
    assert [c.token_ids for c in completions] == [f.token_ids for f in fresh]
    for c, f in zip(completions, fresh, strict=True):
        np.testing.assert_allclose(c.logprobs, f.logprobs, rtol=0, atol=1e-4)


def test_a_cached_prefix_shorter_than_a_prefill_call_is_not_reused(model: Decoder) -> None:
    """Reuse makes the rest of a prompt a prefill call of its own; a 17-token prefix does not pay for one at
    ``prefill_call_cost`` 32 (CONFIG's), and does at 0."""
    base = prompt(20)

    async def body(engine: JaxEngine) -> float:
        await engine.generate(base, GREEDY)
        engine.reset_stats()
        await engine.generate(base[:17] + prompt(8, 5), GREEDY)
        return engine.stats()["reused_prefix_tokens"]

    assert CONFIG.prefill_call_cost == 32 and run(model, body) == 0
    assert run(model, body, EngineConfig(**{**vars(CONFIG), "prefill_call_cost": 0})) == 17


def test_a_request_in_flight_across_a_swap_leaves_no_prefix_for_the_new_weights(model: Decoder) -> None:
    """The next turn of a conversation whose first turn was decoding when new weights arrived must be computed
    wholly by the new weights: the first turn's keys/values (old weights) are not reused, so the next turn's
    tokens and logprobs equal a fresh run of the new weights on the whole prompt."""
    new_model = lively_model(1)
    turn1 = prompt(20)
    tool_output = prompt(9, 1)
    long = SamplingParams(temperature=0.0, max_new_tokens=30)

    async def conversation(engine: JaxEngine) -> tuple[Any, Any, dict[str, float]]:
        pending = asyncio.create_task(engine.generate(turn1, long))
        await until(lambda: engine.stats()["generated_tokens"] >= 3)
        engine.swap_weights(new_model, 1)
        first = await pending
        second = await engine.generate(turn1 + first.token_ids + tool_output, GREEDY)
        return first, second, engine.stats()

    first, second, stats = run(model, conversation)
    assert set(first.policy_versions) == {0, 1}, "the swap landed while the first turn was decoding"
    assert set(second.policy_versions) == {1}
    assert stats["reused_prefix_tokens"] == 0
    fresh = run(new_model, lambda e: e.generate(turn1 + first.token_ids + tool_output, GREEDY))
    assert second.token_ids == fresh.token_ids
    np.testing.assert_allclose(second.logprobs, fresh.logprobs, rtol=0, atol=1e-4)


def test_engine_satisfies_the_engine_protocol(model: Decoder) -> None:
    engine = JaxEngine(model, CONFIG, policy_version=3)
    assert isinstance(engine, Engine)
    assert (engine.policy_version, engine.max_seq_len) == (3, 96)
    with pytest.raises(ValueError, match="max_seq_len=512 exceeds the model's max_seq_len=256"):
        JaxEngine(model, EngineConfig(max_seq_len=512, prefill_buckets=(16,)))


def test_engine_config_names_bad_values() -> None:
    with pytest.raises(ValueError, match="mode .*'batch'"):
        EngineConfig(mode="batch")
    with pytest.raises(ValueError, match=r"prefill_buckets .*\(32, 16\)"):
        EngineConfig(prefill_buckets=(32, 16))
    with pytest.raises(ValueError, match="512 > max_seq_len=256"):
        EngineConfig(prefill_buckets=(512,), max_seq_len=256)


ONE_SLOT = EngineConfig(num_slots=1, max_seq_len=96, prefill_buckets=(16, 32), decode_steps=1)


def test_next_step_is_dispatched_before_the_previous_one_is_read(model: Decoder) -> None:
    """Pipelining: the device gets step N+1 before the host waits for step N's tokens."""
    events: list[str] = []

    async def body(engine: JaxEngine) -> Any:
        runner = engine._runner
        dispatch, collect = runner.dispatch, runner.collect

        def logged_dispatch(*args: Any) -> Any:
            events.append("dispatch")
            return dispatch(*args)

        def logged_collect(*args: Any) -> Any:
            events.append("collect")
            return collect(*args)

        runner.dispatch, runner.collect = logged_dispatch, logged_collect  # type: ignore[method-assign]
        return await engine.generate(prompt(5), SamplingParams(temperature=0.0, max_new_tokens=4))

    completion = run(model, body)
    assert len(completion.token_ids) == 4
    # Four steps; the length limit is known in advance, so no fifth one is dispatched.
    assert events == ["dispatch", "dispatch", "collect", "dispatch", "collect", "dispatch", "collect", "collect"]


def test_stop_then_next_request_in_the_same_slot_match_solo_runs(model: Decoder) -> None:
    """A request ending on a stop id is still a row of the call dispatched before its stop was read
    (pipelining); that row samples and writes nothing, and the next request admitted to its slot is unaffected."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    free = run(model, lambda e: e.generate(prompt(6), sampling), ONE_SLOT)
    stop = next(t for i, t in enumerate(free.token_ids) if i >= 4 and t not in free.token_ids[:i])
    stopping = SamplingParams(**{**vars(sampling), "stop_ids": (stop,)})
    follower = (prompt(9, 3), SamplingParams(temperature=0.0, max_new_tokens=10))
    solo = run(model, lambda e: e.generate(*follower), ONE_SLOT)

    async def body(engine: JaxEngine) -> tuple[Any, ...]:
        return tuple(await asyncio.gather(engine.generate(prompt(6), stopping), engine.generate(*follower)))

    stopped, after = run(model, body, ONE_SLOT)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert after.token_ids == solo.token_ids
    np.testing.assert_allclose(after.logprobs, solo.logprobs, atol=1e-5)


def all_at_once(requests: list[tuple[list[int], SamplingParams]]) -> Callable[[JaxEngine], Awaitable[Any]]:
    """An engine body submitting every request at once: their completions and the engine's stats meanwhile."""

    async def body(engine: JaxEngine) -> tuple[list[Any], dict[str, float]]:
        engine.reset_stats()
        completions = await asyncio.gather(*[engine.generate(*r) for r in requests])
        return completions, engine.stats()

    return body


def test_queued_request_takes_a_slot_while_its_last_token_is_in_flight(model: Decoder) -> None:
    """One slot, two greedy requests of 5 and 7 tokens: 12 decode steps, none idle between them."""
    requests = [(prompt(7), SamplingParams(temperature=0.0, max_new_tokens=5)),
                (prompt(12, 1), SamplingParams(temperature=0.0, max_new_tokens=7))]
    solos = [run(model, lambda e, r=r: e.generate(*r), ONE_SLOT) for r in requests]

    completions, stats = run(model, all_at_once(requests), ONE_SLOT)
    assert [c.token_ids for c in completions] == [s.token_ids for s in solos]
    assert stats["decode_steps"] == 12 and stats["slot_occupancy"] == 1.0 and stats["requests_finished"] == 2


def test_a_request_leaving_its_slot_with_its_last_token_in_flight_leaves_its_prefix(model: Decoder) -> None:
    """One slot: the queued request takes it while the first one's last token is in flight. The first
    request's keys/values (prompt and every token but that last one) stay cached for its next turn."""
    first_prompt = prompt(40)
    requests = [(first_prompt, SamplingParams(temperature=0.0, max_new_tokens=5)),
                (prompt(12, 1), SamplingParams(temperature=0.0, max_new_tokens=7))]

    async def body(engine: JaxEngine) -> tuple[dict[str, float], list[int], Any, dict[str, float]]:
        first, _ = (await all_at_once(requests)(engine))[0]
        during = engine.stats()
        engine.reset_stats()
        turn2 = first_prompt + first.token_ids + prompt(9, 2)
        return during, turn2, await engine.generate(turn2, GREEDY), engine.stats()

    during, turn2, second, after = run(model, body, ONE_SLOT)
    assert during["decode_steps"] == 12 and during["slot_occupancy"] == 1.0  # the hand-over cost no step
    assert after["reused_prefix_tokens"] == 40 + 5 - 1
    fresh = run(model, lambda e: e.generate(turn2, GREEDY), EngineConfig(**{**vars(ONE_SLOT), "prefix_reuse": False}))
    assert second.token_ids == fresh.token_ids
    np.testing.assert_allclose(second.logprobs, fresh.logprobs, rtol=0, atol=1e-4)


class _Result:
    """A dispatched step's output that is (or is not yet) ready when the host asks."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready

    def is_ready(self) -> bool:
        return self.ready

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.zeros(2, np.int32)


def test_busy_time_counts_overlapping_steps_once_and_host_bound_steps_not_at_all() -> None:
    now = [0.0]
    runner = DeviceRunner(steps_for(nnx.graphdef(lively_model(0)), 1), {}, 2, jax.devices()[0], lambda: now[0])

    def collect(at: float, read_at: float, ready: bool) -> tuple[float, bool]:
        now[0] = read_at
        out = runner.collect(Dispatched(_Result(ready), _Result(ready), _Result(ready), at))
        return out.busy_s, out.host_bound

    assert collect(0.0, 10.0, ready=False) == (10.0, False)
    assert collect(4.0, 15.0, ready=False) == (5.0, False)  # dispatched at 4 while the first ran: 10..15 only
    assert collect(20.0, 30.0, ready=True) == (0.0, True)  # already done when read: when it ended is unknown
    assert collect(22.0, 35.0, ready=False) == (13.0, False)


SCARCE = EngineConfig(num_slots=4, max_seq_len=96, prefill_buckets=(16, 32), block_size=16, num_blocks=8,
                      decode_steps=1)
"""Blocks for two requests of 52 positions (4 blocks each) although four slots are free."""


def test_requests_wait_for_free_blocks_and_reuse_them_with_the_same_greedy_tokens(model: Decoder) -> None:
    requests = [(prompt(40, k), GREEDY) for k in range(4)]  # 40 + 12 positions: 4 blocks of 16
    solos = [run(model, lambda e, r=r: e.generate(*r)) for r in requests]

    completions, stats = run(model, all_at_once(requests), SCARCE)
    assert [c.token_ids for c in completions] == [s.token_ids for s in solos]
    for c, s in zip(completions, solos, strict=True):
        np.testing.assert_allclose(c.logprobs, s.logprobs, atol=1e-4)  # other batch sizes round differently
    # Admitted two at a time by blocks, not four by slots: at least two waves of 12 decode steps.
    assert stats["decode_steps"] >= 24 and stats["slot_occupancy"] <= 0.5


def test_block_pool_reserves_and_returns_blocks() -> None:
    pool = BlockPool(num_blocks=6, block_size=4, num_slots=2, max_seq_len=16)
    assert pool.admit(0, [1, 2, 3], 10) == 0  # 3 blocks, nothing cached yet
    assert pool.table[0].tolist() == [0, 1, 2, 6] and pool.free_blocks == 3
    assert pool.admit(1, [4], 13) is None  # 4 blocks, 3 free: nothing changes
    assert pool.table[1].tolist() == [6, 6, 6, 6] and pool.free_blocks == 3
    with pytest.raises(RuntimeError, match="still holds 3 blocks"):
        pool.admit(0, [1], 4)
    pool.release(0)  # nothing retained: nothing cached
    assert pool.table[0].tolist() == [6, 6, 6, 6] and pool.free_blocks == 6 and pool.cached_blocks == 0


def test_block_pool_shares_full_blocks_and_hands_a_partly_matching_one_to_a_single_writer() -> None:
    pool = BlockPool(num_blocks=8, block_size=4, num_slots=3, max_seq_len=16)
    sequence = list(range(1, 11))
    pool.admit(0, sequence[:6], 12)  # blocks 0, 1, 2
    pool.release(0, sequence)  # caches [1..4] in 0, [5..8] in 1, [9, 10] in 2; all free, none lost
    assert (pool.cached_blocks, pool.free_blocks) == (3, 8)
    # The next turn reads blocks 0 and 1, adopts block 2 (its two tokens match) and gets block 3 for the rest.
    assert pool.admit(1, [*sequence, 11, 12, 13], 16) == 10
    assert pool.table[1].tolist() == [0, 1, 2, 3] and pool.cached_blocks == 2
    # Another prompt reads block 0 too; block 1 is read by slot 1, so nobody may write it: 4 tokens reused.
    assert pool.admit(2, [1, 2, 3, 4, 5, 9, 9], 8) == 4
    assert pool.table[2].tolist()[:2] == [0, 4]
    pool.release(1)
    pool.release(2)
    assert (pool.cached_blocks, pool.free_blocks) == (2, 8)


def test_block_pool_evicts_least_recently_released_tails_first_and_descendants_with_their_parent() -> None:
    pool = BlockPool(num_blocks=4, block_size=2, num_slots=1, max_seq_len=8)
    pool.admit(0, [1, 2, 3, 4, 5], 6)  # blocks 0, 1, 2
    pool.release(0, [1, 2, 3, 4])  # caches [1, 2] in 0 and [3, 4] in 1; block 2 is free, uncached
    assert pool.admit(0, [7, 8, 9], 6) == 0  # takes the uncached 2 and 3, then evicts 1 (the tail), not 0
    assert pool.table[0].tolist() == [2, 3, 1, 4] and pool.cached_blocks == 1
    pool.release(0)
    assert pool.admit(0, [1, 2, 3, 4, 5], 6) == 2  # only the head survived
    pool.release(0, [1, 2, 3, 4])
    assert pool.cached_blocks == 2
    assert pool.admit(0, [1, 9, 9], 4) == 1  # adopts block 0 to write over it: its child [3, 4] goes with it
    assert pool.cached_blocks == 0


def test_block_pool_cache_clear_keeps_blocks_in_use() -> None:
    pool = BlockPool(num_blocks=4, block_size=2, num_slots=2, max_seq_len=8)
    pool.admit(0, [1, 2, 3], 4)
    pool.release(0, [1, 2, 3])
    assert pool.admit(1, [1, 2, 3, 4], 6) == 3
    pool.clear_cache()  # new weights: nothing cached is reused, what slot 1 reads stays its own
    assert pool.cached_blocks == 0 and pool.table[1].tolist() == [0, 1, 2, 4] and pool.free_blocks == 1
    pool.release(1, [])
    assert pool.admit(0, [1, 2, 3, 4], 6) == 0 and pool.free_blocks == 1


def test_attention_spans_are_powers_of_two_blocks_from_128_positions_up_to_a_full_sequence() -> None:
    config = EngineConfig(max_seq_len=96, prefill_buckets=(16,), block_size=4)
    assert config.attention_spans == (24,)  # a sequence shorter than 128 positions: one span
    config = EngineConfig(max_seq_len=600, prefill_buckets=(16,), block_size=16)  # 38 blocks; 128 positions: 8
    assert config.attention_spans == (8, 16, 32, 38)
    assert [config.span_for(n) for n in (1, 128, 129, 257, 513, 600)] == [8, 8, 16, 32, 38, 38]
    with pytest.raises(ValueError, match="num_blocks=5 cannot hold one sequence"):
        EngineConfig(max_seq_len=96, prefill_buckets=(16,), block_size=16, num_blocks=5)


def test_decode_runs_occupied_slots_in_row_buckets_and_admitted_prompts_prefill_together(model: Decoder) -> None:
    """Three short prompts on four slots: one prefill call of 4 rows (3 padded to a row bucket), decode over
    4 rows while three run and 1 row once two have finished; the tokens are those of solo runs."""
    requests = [(prompt(5 + k, k), SamplingParams(temperature=0.0, max_new_tokens=m)) for k, m in enumerate((2, 2, 6))]
    solos = [run(model, lambda e, r=r: e.generate(*r)) for r in requests]
    shapes: list[tuple[list[tuple[int, ...]], int]] = []

    async def body(engine: JaxEngine) -> list[Any]:
        dispatch = engine._runner.dispatch

        def logged_dispatch(params: Any, prefills: list[Any], table_rn: np.ndarray, rows: Any) -> Any:
            shapes.append(([call.tokens_rt.shape for call in prefills], table_rn.shape[0]))
            return dispatch(params, prefills, table_rn, rows)

        engine._runner.dispatch = logged_dispatch  # type: ignore[method-assign]
        return await asyncio.gather(*[engine.generate(*r) for r in requests])

    completions = run(model, body)
    assert [c.token_ids for c in completions] == [s.token_ids for s in solos]
    assert shapes == [([(4, 16)], 4), ([], 4)] + [([], 1)] * 4
    assert EngineConfig(num_slots=6).row_buckets == (1, 4, 6) and EngineConfig(num_slots=6).rows_for(5) == 6


def test_prefill_chunks_follow_the_prompt_length_not_the_next_bucket() -> None:
    config = EngineConfig(max_seq_len=1024, prefill_buckets=(16, 32, 64, 128, 256, 512))
    # 288 tokens: 256 + 32 costs 288 + 2 calls x 32 = 352 padded-token equivalents, one 512 call 544.
    assert config.prefill_chunks(288) == (256, 32)
    assert config.prefill_chunks(500) == (512,)  # 256 + 128 + 128 would cost 608
    assert config.prefill_chunks(800) == (512, 256, 32)
    assert config.prefill_chunks(16) == (16,) and config.prefill_chunks(0) == ()
    assert EngineConfig(prefill_buckets=(16, 64), prefill_call_cost=0).prefill_chunks(35) == (16, 16, 16)


def test_prompt_prefilled_in_bucket_chunks_gives_the_greedy_tokens_of_one_padded_chunk(model: Decoder) -> None:
    """A 36-token prompt (35 prefilled) over buckets (16, 64): as three 16-token calls when calls are free,
    as one padded 64-token call when they are dear; the same greedy tokens either way."""
    ids = prompt(36)
    results = {}
    for cost in (0, 64):
        config = EngineConfig(num_slots=4, max_seq_len=96, prefill_buckets=(16, 64), prefill_call_cost=cost)
        shapes: list[tuple[int, ...]] = []

        async def body(engine: JaxEngine, shapes: list[tuple[int, ...]] = shapes) -> Any:
            dispatch = engine._runner.dispatch

            def logged_dispatch(params: Any, prefills: list[Any], table_rn: np.ndarray, rows: Any) -> Any:
                shapes.extend(call.tokens_rt.shape for call in prefills)
                return dispatch(params, prefills, table_rn, rows)

            engine._runner.dispatch = logged_dispatch  # type: ignore[method-assign]
            return await engine.generate(ids, GREEDY)

        results[cost] = (run(model, body, config), shapes)
    (split, split_shapes), (whole, whole_shapes) = results[0], results[64]
    assert split_shapes == [(1, 16)] * 3 and whole_shapes == [(1, 64)]
    assert split.token_ids == whole.token_ids
    np.testing.assert_allclose(split.logprobs, whole.logprobs, rtol=0, atol=1e-4)


MULTI = EngineConfig(**{**vars(CONFIG), "decode_steps": 4})


def test_calls_of_several_steps_give_the_tokens_and_logprobs_of_single_steps(model: Decoder) -> None:
    """Greedy and sampled requests, one ending on a stop id inside a call, others by max_new_tokens (3 is not
    a multiple of the 4 steps a call runs) and by the context: the same tokens and logprobs whether the
    device runs one step per call or four, and a call of four compiles nothing after warm-up."""
    sampling = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, max_new_tokens=30, seed=5)
    free = run(model, lambda e: e.generate(prompt(6), sampling))
    stop = next(t for i, t in enumerate(free.token_ids) if i >= 5 and t not in free.token_ids[:i])
    requests = [
        (prompt(6), SamplingParams(**{**vars(sampling), "stop_ids": (stop,)})),
        (prompt(17, 1), SamplingParams(temperature=0.0, max_new_tokens=3)),
        (prompt(90, 2), SamplingParams(temperature=0.7, max_new_tokens=50, seed=1)),
        (prompt(9, 3), SamplingParams(temperature=0.0, max_new_tokens=14, stop_ids=(9999,))),
        (prompt(12, 4), SamplingParams(temperature=1.3, top_k=5, max_new_tokens=11, seed=2)),
    ]

    async def body(engine: JaxEngine) -> tuple[list[Any], dict[str, float], int]:
        before = engine.stats()["compilations"]
        completions, stats = await all_at_once(requests)(engine)
        return completions, stats, engine.stats()["compilations"] - before

    single, single_stats, _ = run(model, body)
    multi, multi_stats, compiled = run(model, body, MULTI)
    assert multi[0].finish_reason == "stop" and multi[0].token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert [(c.finish_reason, len(c.token_ids)) for c in multi[1:3]] == [("length", 3), ("context", 6)]
    assert [c.token_ids for c in multi] == [c.token_ids for c in single]
    for m, s in zip(multi, single, strict=True):
        np.testing.assert_allclose(m.logprobs, s.logprobs, atol=1e-4)  # other batch sizes round differently
    assert compiled == 0
    assert multi_stats["generated_tokens"] == single_stats["generated_tokens"] == sum(len(c.token_ids) for c in multi)
    assert single_stats["dispatches"] == single_stats["decode_steps"]
    assert multi_stats["dispatches"] < single_stats["dispatches"] / 2


def test_a_row_stopped_inside_a_call_leaves_its_slot_and_prefix_clean(model: Decoder) -> None:
    """One slot, four steps a call: a request ends on a stop id inside a call and the queued one takes the
    slot; the follower matches its solo run, and the stopped request's next turn reuses its prefix (every
    token but the stop, whose keys/values nobody wrote) with the tokens of a fresh prefill."""
    one_slot = EngineConfig(**{**vars(ONE_SLOT), "decode_steps": 4})
    sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=5)
    free = run(model, lambda e: e.generate(prompt(40), sampling), one_slot)
    stop = next(t for i, t in enumerate(free.token_ids) if i >= 5 and i % 4 != 3 and t not in free.token_ids[:i])
    stopping = SamplingParams(**{**vars(sampling), "stop_ids": (stop,)})
    follower = (prompt(9, 3), SamplingParams(temperature=0.0, max_new_tokens=10))
    solo = run(model, lambda e: e.generate(*follower), one_slot)

    async def body(engine: JaxEngine) -> tuple[Any, ...]:
        stopped, after = await asyncio.gather(engine.generate(prompt(40), stopping), engine.generate(*follower))
        engine.reset_stats()
        turn2 = prompt(40) + stopped.token_ids + prompt(9, 2)
        return stopped, after, turn2, await engine.generate(turn2, GREEDY), engine.stats()

    stopped, after, turn2, second, stats = run(model, body, one_slot)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert after.token_ids == solo.token_ids
    np.testing.assert_allclose(after.logprobs, solo.logprobs, atol=1e-5)
    assert stats["reused_prefix_tokens"] == 40 + len(stopped.token_ids) - 1
    fresh = run(model, lambda e: e.generate(turn2, GREEDY), EngineConfig(**{**vars(ONE_SLOT), "prefix_reuse": False}))
    assert second.token_ids == fresh.token_ids
    np.testing.assert_allclose(second.logprobs, fresh.logprobs, rtol=0, atol=1e-4)


def test_too_many_stop_ids_are_refused_naming_the_limit(model: Decoder) -> None:
    config = EngineConfig(**{**vars(CONFIG), "max_stop_ids": 2})
    with pytest.raises(ValueError, match="3 stop ids exceed EngineConfig.max_stop_ids=2"):
        run(model, lambda e: e.generate(prompt(5), SamplingParams(stop_ids=(1, 2, 3))), config)


SERVING = EngineConfig(num_slots=64, max_seq_len=1024, block_size=16, decode_steps=8)
"""Rows in powers of four up to 64: 1, 4, 16, 64. Spans of a power of two of 16-position blocks, from 128
positions (8 blocks) to the context's 64: 8, 16, 32, 64. Decode: 4 x 4 = 16 programs. Prefill: 5 prompt
buckets (16 to 256) x 4 row buckets = 20."""


def test_warmup_of_a_serving_config_compiles_its_36_variants_and_nothing_after() -> None:
    assert (SERVING.row_buckets, SERVING.attention_spans) == ((1, 4, 16, 64), (8, 16, 32, 64))
    assert (SERVING.decode_variants, SERVING.prefill_variants) == (16, 20)
    model = Decoder(dataclasses.replace(ModelConfig.tiny(), max_seq_len=1024, n_layers=1), rngs=nnx.Rngs(0))

    async def main() -> tuple[int, int, int]:
        async with JaxEngine(model, SERVING) as engine:
            start = engine.stats()["compilations"]
            await engine.warmup()
            warm = engine.stats()["compilations"]
            long_prompts = [engine.generate(prompt(300 + 37 * k, k), SamplingParams(max_new_tokens=40, seed=k))
                            for k in range(6)]
            short = [engine.generate(prompt(5 + k, k), GREEDY) for k in range(3)]
            await asyncio.wait_for(asyncio.gather(*long_prompts, *short), timeout=300)
            return start, warm, engine.stats()["compilations"]

    start, warm, after = asyncio.run(main())
    assert (warm - start, after) == (36, warm)


def test_decode_step_bytes_count_the_layers_the_rows_embeddings_the_whole_unembedding_and_the_span() -> None:
    tiny = ModelConfig.tiny()  # vocab 512, d 128, 4 layers, 4 heads of 32 (2 for keys/values), MLP 384, tied
    layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 384 + 2 * 128  # q, k and v, o, gated MLP, 2 norms
    assert layer == 196_864
    weights = 4 * layer + 128 + 4 * 128 + 512 * 128  # layers, final norm, 4 rows' embeddings, the unembedding
    kv = 4 * 64 * 4 * 2 * 2 * 32  # rows x span x layers x (keys, values) x kv heads x head dim
    assert decode_step_bytes(tiny, rows=4, span_positions=64) == 4 * (weights + kv) == 3_938_816
    untied = dataclasses.replace(tiny, tie_embeddings=False, dtype="bfloat16")  # lm_head: another 512 x 128
    assert decode_step_bytes(untied, rows=4, span_positions=64) == 2 * (weights + kv)
