"""Supervised warm start on demonstrations: the rows, the training loop, and the mean NLL that scores it.

```
demonstration_rows   the campaign's env (with its options), train split: n demonstrations, error_rate share flawed
                     (reward 0; the env's configured mistakes), each conversation laid out as an episode records it
                     (ChatTokenizer.encode_conversation): loss only on the assistant's tokens, tool schemas in the
                     prompt iff the agent offers tools
sft_train            the one train_step with the ``nll`` loss, seeded batch order, progress every few steps
```

Everything is deterministic by ``SFTConfig.seed`` (which demonstrations are flawed, batch order). The warm-start
stage (``pipelines_lib.stages.warm_start``) builds the model, runs this and publishes version 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import numpy as np

from pipelines_lib import telemetry
from pipelines_lib.envs.spec import EnvSpec
from pipelines_lib.heap import trim_heap_after_compiles
from pipelines_lib.mesh import MeshConfig, make_mesh, shard_batch, shard_node
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.train.batch import build_train_batch
from pipelines_lib.train.losses import LossConfig
from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer
from pipelines_lib.train.step import StepConfig, logprobs_fn, train_step


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Supervised warm start on demonstrations from the env's generator; publishes version 0."""

    n_demos: int = 512
    """Demonstrations generated from the env's train split."""
    error_rate: float = 0.3
    """Share of flawed demonstrations, so the warm policy is decent but far from perfect."""
    steps: int = 200
    """Optimizer steps of the warm start (0 publishes the random initialisation)."""
    batch_size: int = 16
    """Demonstrations per step."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3, warmup_steps=10, schedule="cosine",
                                                                   total_steps=200, weight_decay=0.01))
    seed: int = 0
    """Seed of demonstrations, initialisation and batch order."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Devices the warm start trains on (default one device); ``batch_size`` must divide by ``data`` × ``fsdp``."""

    def __post_init__(self) -> None:
        if self.n_demos < 1 or self.steps < 0 or self.batch_size < 1:
            raise ValueError(f"SFTConfig n_demos/steps/batch_size out of range: {self.n_demos}/{self.steps}/"
                             f"{self.batch_size}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"SFTConfig.error_rate must be in [0, 1], got {self.error_rate}")


SFT_STEP = StepConfig(loss=LossConfig(name="nll"))
LENGTH_QUANTUM = 32
"""SFT batches are padded to the longest demonstration rounded up to this (one compilation per run)."""

Rows = tuple[list[list[int]], list[list[int]]]
"""``(tokens, loss_masks)``: one list per demonstration."""


def demonstration_rows(
    env: EnvSpec, tokenizer: ChatTokenizer, *, n: int, error_rate: float, seed: int, with_tools: bool
) -> Rows:
    """Token ids and assistant-only loss masks of ``n`` demonstrations on the train split of ``env`` (the campaign's:
    its options shape the tasks and, through the env's ``mistakes``, the flawed demonstrations)."""
    tokens, masks = [], []
    for task in env.generate_tasks(seed=seed, n=n, split="train"):
        made = env.make(task.env_name)
        schemas = [t.schema() for t in made.tools().values()] if with_tools else None
        ids, mask = tokenizer.encode_conversation(
            made.demonstration(task, error_rate=error_rate, seed=seed), schemas
        )
        tokens.append(ids)
        masks.append(mask)
    return tokens, masks


def _seq_len(rows: Rows, max_seq_len: int) -> int:
    longest = max(len(r) for r in rows[0])
    return min(-(-longest // LENGTH_QUANTUM) * LENGTH_QUANTUM, max_seq_len)


def mean_nll(model: Decoder, rows: Rows, *, pad_id: int, batch_size: int = 32) -> float:
    """Mean negative log-likelihood per loss token of ``rows`` under ``model`` (the SFT objective)."""
    seq_len = _seq_len(rows, model.cfg.max_seq_len)
    total, count = 0.0, 0.0
    for start in range(0, len(rows[0]), batch_size):
        part = rows[0][start : start + batch_size], rows[1][start : start + batch_size]
        batch = build_train_batch(*part, seq_buckets=(seq_len,), batch_size=batch_size, pad_id=pad_id)
        logp_bt = logprobs_fn(model, jnp.asarray(batch.tokens_bt), jnp.asarray(batch.positions_bt))
        total += float(-(logp_bt * batch.loss_mask_bt).sum())
        count += float(batch.loss_mask_bt.sum())
    return total / count


def sft_train(
    model: Decoder,
    rows: Rows,
    cfg: SFTConfig,
    *,
    pad_id: int,
    log: Callable[[str], None] = print,
    log_every: int = 25,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """``cfg.steps`` nll steps on ``rows`` (batches of ``cfg.batch_size``, epochs shuffled by ``cfg.seed``)."""
    tokens, masks = rows
    if not tokens:
        raise ValueError("sft_train: no demonstrations to train on")
    seq_len = _seq_len(rows, model.cfg.max_seq_len)
    mesh = make_mesh(cfg.mesh)
    if reason := trim_heap_after_compiles():
        log(f"sft: {reason}")
    shard_node(model, mesh)
    optimizer = make_nnx_optimizer(model, cfg.optim, mesh)
    rng = np.random.default_rng(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    started = clock()
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            order += rng.permutation(len(tokens)).tolist()
        idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
        batch = build_train_batch(
            [tokens[i] for i in idx],
            [masks[i] for i in idx],
            seq_buckets=(seq_len,),
            batch_size=cfg.batch_size,
            pad_id=pad_id,
        )
        metrics = train_step(model, optimizer, shard_batch(batch, mesh), cfg=SFT_STEP)
        losses.append(float(metrics["nll"]))
        # per step, as the trainer's train.* gauges: TensorBoard shows the warm start's curve before GRPO's
        telemetry.gauge("sft.nll", losses[-1], step=step + 1)
        telemetry.gauge("sft.grad_norm", float(metrics["grad_norm"]), step=step + 1)
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            window = losses[-log_every:]
            log(
                f"sft step {step + 1}/{cfg.steps}: nll {np.mean(window):.4f} "
                f"({clock() - started:.1f}s, grad_norm {float(metrics['grad_norm']):.3f})"
            )
    return {
        "steps": cfg.steps,
        "seq_len": seq_len,
        "first_nll": losses[0] if losses else None,
        "final_nll": float(np.mean(losses[-min(10, len(losses)) :])) if losses else None,
        "train_s": clock() - started,
    }


__all__ = ["SFTConfig", "demonstration_rows", "mean_nll", "sft_train"]
