"""The warm-start stage: a version-0 policy, trained on demonstrations or imported, then published.

```
warm_start(store, config)
  weights/v00000000 published already?  -> its manifest, nothing else happens
  config.init_from = HF folder           -> model.hf_import.load_hf_checkpoint
  config.init_from = campaign URL        -> that campaign's LATEST weights
  otherwise (SFT):
    demonstration_rows   env generator, train split: n_demos tasks, error_rate share flawed (reward 0),
                         each conversation laid out as an episode records it (ChatTokenizer.encode_conversation):
                         loss only on the assistant's tokens, tool schemas in the prompt iff the agent offers tools
    sft_train            the one train_step with the ``nll`` loss, seeded batch order, progress every few steps
  -> publish_weights(version=0, step=0)
```

Everything is deterministic by ``config.sft.seed`` (tasks, which demonstrations are flawed, initialisation,
batch order). Demonstrations longer than the model's context are left out and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pipelines_lib.agents import AGENT_REGISTRY
from pipelines_lib.config import CampaignConfig, SFTConfig
from pipelines_lib.envs import env_class, make_env
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_import import load_hf_checkpoint
from pipelines_lib.model.tokenizer import ChatTokenizer
from pipelines_lib.publish import load_published, publish_weights, published_marker
from pipelines_lib.rollout.episodes import campaign_tokenizer, campaign_tokenizer_dir
from pipelines_lib.storage.store import Store
from pipelines_lib.train.batch import build_train_batch
from pipelines_lib.train.losses import LossConfig
from pipelines_lib.train.mesh import make_mesh, shard_batch, shard_node
from pipelines_lib.train.optim import make_nnx_optimizer
from pipelines_lib.train.step import StepConfig, logprobs_fn, train_step

SFT_STEP = StepConfig(loss=LossConfig(name="nll"))
LENGTH_QUANTUM = 32
"""SFT batches are padded to the longest demonstration rounded up to this (one compilation per run)."""

Rows = tuple[list[list[int]], list[list[int]]]
"""``(tokens, loss_masks)``: one list per demonstration."""


def demonstration_rows(
    env_name: str, tokenizer: ChatTokenizer, *, n: int, error_rate: float, seed: int, with_tools: bool
) -> Rows:
    """Token ids and assistant-only loss masks of ``n`` demonstrations on the env's train split."""
    tasks = env_class(env_name).generate_tasks(seed=seed, n=n, split="train")
    tokens, masks = [], []
    for task in tasks:
        env = make_env(task.env_name)
        schemas = [t.schema() for t in env.tools().values()] if with_tools else None
        ids, mask = tokenizer.encode_conversation(
            env.demonstration(task, error_rate=error_rate, seed=seed), schemas
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


def _import_weights(init_from: str, store: Store) -> tuple[Decoder, dict[str, Any]]:
    if "://" not in init_from and (Path(init_from) / "config.json").is_file():
        return load_hf_checkpoint(init_from), {"source": "hf", "init_from": init_from}
    # Another campaign; on the same backend it is reached with the same credentials/endpoint as ours.
    model, version = load_published(store.other(init_from))
    return model, {"source": "campaign", "init_from": init_from, "from_version": version}


def warm_start(store: Store, config: CampaignConfig, *, cache: Path | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Publish version 0 (see the module docstring); a no-op returning its manifest if it is published.
    ``cache`` is the process's cache folder (``Settings.cache``)."""
    if store.exists(published_marker(0)):
        return {**store.read_json(published_marker(0)), "skipped": True}
    started = time.perf_counter()
    if config.init_from is not None:
        model, info = _import_weights(config.init_from, store)
    else:
        tokenizer = campaign_tokenizer(config, cache=cache)
        if tokenizer.vocab_size > config.model.vocab_size:
            raise ValueError(
                f"tokenizer has {tokenizer.vocab_size} ids but model.vocab_size is {config.model.vocab_size}"
            )
        sft = config.sft
        tokens, masks = demonstration_rows(
            config.env.name,
            tokenizer,
            n=sft.n_demos,
            error_rate=sft.error_rate,
            seed=sft.seed,
            with_tools=AGENT_REGISTRY[config.agent.kind].uses_tools,
        )
        keep = [i for i, row in enumerate(tokens) if len(row) <= config.model.max_seq_len]
        rows = [tokens[i] for i in keep], [masks[i] for i in keep]
        model = Decoder(config.model, rngs=nnx.Rngs(sft.seed))
        log(
            f"sft: {len(keep)} demonstrations (longest {max(map(len, rows[0]))} tokens, "
            f"{len(tokens) - len(keep)} too long), {sft.steps} steps of {sft.batch_size} on {jax.default_backend()}"
        )
        info = {
            "source": "sft",
            "demos": len(keep),
            "demos_too_long": len(tokens) - len(keep),
            **sft_train(
                model, rows, sft, pad_id=tokenizer.pad_id, log=log, log_every=max(1, min(25, sft.steps // 6))
            ),
        }
    manifest = publish_weights(store, model, version=0, step=0, tokenizer_dir=campaign_tokenizer_dir(config))
    return {**manifest, **info, "wall_s": time.perf_counter() - started, "skipped": False}


__all__ = ["demonstration_rows", "mean_nll", "sft_train", "warm_start"]
