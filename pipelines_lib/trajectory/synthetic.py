"""Synthetic but valid trajectories, for demos, benchmarks and storage tests that need no model.

A group has ``group_size`` samples of one prompt; each sample is a prompt, an assistant turn, a tool turn
and a final assistant turn, with lengths and rewards drawn from a seeded RNG.
"""

from __future__ import annotations

import random

from pipelines_lib.trajectory.record import Timings, Trajectory, Turn
from pipelines_lib.utc import utc_now_iso


def synthetic_group(*, prompt_id: str, group_size: int, worker_id: str, policy_version: int, seed: int,
                    vocab_size: int = 512, max_len: int = 96) -> list[Trajectory]:
    rng = random.Random(f"{prompt_id}:{seed}")
    prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(8, 16))]
    out = []
    for idx in range(group_size):
        n_gen1, n_tool, n_gen2 = rng.randint(2, max_len // 4), rng.randint(2, 8), rng.randint(1, max_len // 4)
        tokens = prompt + [rng.randrange(vocab_size) for _ in range(n_gen1 + n_tool + n_gen2)]
        mask = [0] * len(prompt) + [1] * n_gen1 + [0] * n_tool + [1] * n_gen2
        logp = [round(-rng.random() * 3, 4) if m else 0.0 for m in mask]
        ver = [policy_version if m else -1 for m in mask]
        a, b, c = len(prompt), len(prompt) + n_gen1, len(prompt) + n_gen1 + n_tool
        turns = [
            Turn(role="user", start=0, end=a),
            Turn(role="assistant", start=a, end=b, latency_s=0.01),
            Turn(role="tool", start=b, end=c, tool_name="calculator", latency_s=rng.random() / 10),
            Turn(role="assistant", start=c, end=len(tokens), latency_s=0.01),
        ]
        reward = float(rng.random() < 0.5)
        now = utc_now_iso()
        out.append(Trajectory(
            group_id=f"{prompt_id}@{worker_id}", prompt_id=prompt_id, sample_idx=idx, group_size=group_size,
            worker_id=worker_id, tokens=tokens, loss_mask=mask, logprobs=logp, policy_version=ver,
            prompt_len=len(prompt), turns=turns, reward=reward, reward_parts={"correct": reward},
            status="ok", timings=Timings(generate_s=0.02, env_s=0.01, started_at=now, finished_at=now),
            env_name="synthetic", task_id=prompt_id, tokenizer_hash="synthetic", engine_info="{}",
        ))
    return out
