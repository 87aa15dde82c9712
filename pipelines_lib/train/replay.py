"""Replay one logged training step from storage alone, exactly as the trainer took it, or under another loss.

```
 restore the newest committed checkpoint before step N          (none: the warm start, version 0)
 re-train steps K+1..N−1 from the rows their consumption logs name         (same rows, same order)
 re-form step N's batch from the rows its log names
 per-token terms before the update: log-probs (proximal), weights, per-token loss
 train_step on it (the trainer's own function)  →  loss, grad_norm, clip fractions, ratio statistics
 log-probs after the update                                                 (the "current" policy)
 compare loss and grad_norm with the log: equal floats on the same backend and mesh
```

Nothing is written: the checkpoint, the shards and the logs are only read, and a what-if
(``what_if``: another ``TrainerConfig`` whose loss or advantage estimator differs) changes only step N's
recomputation, never the steps replayed before it. The per-token loss comes from the loss itself: every loss
is ``Σ_bt weight_bt · loss_bt`` (``losses``), so ``loss_bt = ∂loss / ∂weight_bt``, whatever the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import numpy as np
import pyarrow as pa
from flax import nnx

from pipelines_lib.model.decoder import Decoder
from pipelines_lib.records import CheckpointMeta, ConsumptionLog, consumption_steps
from pipelines_lib.train.batch import TrainBatch, batch_from_groups
from pipelines_lib.train.checkpoint import restore_latest
from pipelines_lib.train.config import TrainerConfig
from pipelines_lib.train.losses import get_loss
from pipelines_lib.train.reload import reload_step
from pipelines_lib.train.step import StepConfig, batch_rows, logprobs_fn, loss_inputs, train_step
from pipelines_lib.train.trainer import StreamingTrainer
from pipelines_lib.trajectory.channel import GroupSlice

COMPARED = ("loss", "grad_norm")
"""The logged metrics a replay must reproduce exactly to count as identical."""


@partial(nnx.jit, static_argnames=("cfg",))
def token_terms(model: Decoder, batch: TrainBatch, *, cfg: StepConfig) -> dict[str, jax.Array]:
    """Per-token terms of ``cfg``'s loss on ``batch`` before an update, each ``[B, T]``.

    ``logp_bt``: the current parameters' log-probs (the proximal policy of a one-update step); ``weight_bt``: the
    aggregation weights; ``loss_bt``: the unweighted per-token loss, ``∂L/∂weight_bt`` of ``L = Σ weight_bt · loss_bt``.
    """
    x = loss_inputs(model, batch_rows(batch, cfg), cfg=cfg)
    loss_fn = get_loss(cfg.loss.name)
    loss_bt = jax.grad(lambda weight_bt: loss_fn(x._replace(weight_bt=weight_bt), cfg.loss)[0])(x.weight_bt)
    return {"logp_bt": x.prox_logp_bt, "weight_bt": x.weight_bt, "loss_bt": loss_bt}


@dataclass(frozen=True, kw_only=True)
class GroupContribution:
    """One group of the replayed batch and what it added to the loss."""

    group_id: str
    shard: str
    row_start: int
    row_end: int
    rewards: list[float]
    """In ``sample_idx`` order, as the batch holds them."""
    advantages: list[float]
    loss: float
    """``Σ weight_bt · loss_bt`` over the group's tokens: the group's share of the step's loss."""


@dataclass(frozen=True, kw_only=True)
class StepReplay:
    """Step ``step`` recomputed from storage next to what its consumption log recorded."""

    step: int
    from_checkpoint: int
    """Step of the checkpoint restored (0: none before ``step``; the warm start)."""
    replayed_steps: int
    """Logged steps re-trained between that checkpoint and ``step``."""
    metrics: dict[str, float]
    """The recomputed step's metrics (``train_step``'s)."""
    logged: dict[str, float]
    groups: list[GroupContribution]
    rows: pa.Table
    """One row per trajectory of the batch, padding rows left out: provenance, tokens, loss mask, log-probs
    (behaviour, proximal, current after the update), advantage and per-token loss, trimmed to the row."""

    @property
    def identical(self) -> bool:
        """Loss and gradient norm equal the logged ones exactly (the same floats)."""
        return all(self.metrics.get(k) == self.logged.get(k) for k in COMPARED)


def retrain_to(trainer: StreamingTrainer, step: int) -> CheckpointMeta | None:
    """Bring a freshly built ``trainer``'s parameters and optimiser to their state after ``step``: restore the
    newest committed checkpoint at or before it, re-train the logged steps after it from the rows their logs
    name. Returns that checkpoint's meta (None: none, the warm start). Reads only."""
    store = trainer.store
    restored = restore_latest(store, model=trainer.model, optimizer=trainer.optimizer, before_step=step + 1)
    start = 0 if restored is None else restored[1].step
    for s in range(start + 1, step + 1):
        groups = reload_step(trainer.tailer, ConsumptionLog.read(store, s), trainer.needs, uri=store.uri)
        batch, _ = trainer.batch(groups)
        train_step(trainer.model, trainer.optimizer, batch, cfg=trainer.tc.step)
    return None if restored is None else restored[1]


def replay_step(trainer: StreamingTrainer, step: int, *, what_if: TrainerConfig | None = None) -> StepReplay:
    """Recompute ``step`` on a freshly built ``trainer`` (its parameters are version 0's; they end as after
    ``step``). ``what_if`` replaces the trainer's config for step ``step`` only; the steps before it are
    replayed as logged. Reads only; raises ``ValueError`` naming the campaign when ``step`` has no log."""
    store = trainer.store
    if not ConsumptionLog.exists(store, step):
        steps = consumption_steps(store)
        logged = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
        raise ValueError(f"{store.uri()}: step {step} has no consumption log (logged: {logged})")
    restored = retrain_to(trainer, step - 1)
    start = 0 if restored is None else restored.step
    entry = ConsumptionLog.read(store, step)
    groups = reload_step(trainer.tailer, entry, trainer.needs, uri=store.uri)
    tc = what_if or trainer.tc
    batch, _ = batch_from_groups(groups, group_size=trainer.group_size, advantage=tc.advantage,
                                 seq_buckets=tc.seq_buckets, batch_size=tc.batch_groups * trainer.group_size,
                                 pad_id=trainer.pad_id)
    terms = {k: np.asarray(v) for k, v in token_terms(trainer.model, batch, cfg=tc.step).items()}
    metrics = {k: float(v) for k, v in train_step(trainer.model, trainer.optimizer, batch, cfg=tc.step).items()}
    terms["after_bt"] = np.asarray(logprobs_fn(trainer.model, batch.tokens_bt, batch.positions_bt,
                                                   logit_chunk_tokens=tc.step.logit_chunk_tokens))
    rows = _rows_table(step, groups, batch, terms)
    contribution_b = rows.column("contribution").to_pylist()
    k = trainer.group_size
    contributions = [
        GroupContribution(group_id=g.group_id, shard=g.shard, row_start=g.row_start, row_end=g.row_end,
                          rewards=rows.column("reward").to_pylist()[i * k:(i + 1) * k],
                          advantages=rows.column("advantage").to_pylist()[i * k:(i + 1) * k],
                          loss=float(sum(contribution_b[i * k:(i + 1) * k])))
        for i, g in enumerate(groups)
    ]
    return StepReplay(step=step, from_checkpoint=start, replayed_steps=step - 1 - start, metrics=metrics,
                      logged=dict(entry.metrics), groups=contributions, rows=rows)


def _rows_table(step: int, groups: list[GroupSlice], batch: TrainBatch, terms: dict[str, np.ndarray]) -> pa.Table:
    """The batch's trajectory rows in batch order (groups in log order, samples by ``sample_idx``)."""
    out: dict[str, list] = {c: [] for c in (
        "step", "group_id", "shard", "shard_row", "sample_idx", "reward", "advantage", "tokens", "loss_mask",
        "logp_behaviour", "logp_proximal", "logp_current", "loss_token", "contribution")}
    b = 0
    for g in groups:
        sample_idx = g.table.column("sample_idx").to_pylist()
        for i in np.argsort(sample_idx):
            n = len(g.table.column("tokens")[int(i)])
            mask_t = np.asarray(batch.loss_mask_bt)[b, :n]
            out["step"].append(step)
            out["group_id"].append(g.group_id)
            out["shard"].append(g.shard)
            out["shard_row"].append(g.row_start + int(i))
            out["sample_idx"].append(sample_idx[int(i)])
            out["reward"].append(g.table.column("reward")[int(i)].as_py())
            out["advantage"].append(float(np.asarray(batch.advantages_bt)[b, 0]))
            out["tokens"].append(np.asarray(batch.tokens_bt)[b, :n].tolist())
            out["loss_mask"].append(mask_t.astype(np.int8).tolist())
            out["logp_behaviour"].append(np.asarray(batch.behav_logp_bt)[b, :n].tolist())
            out["logp_proximal"].append(terms["logp_bt"][b, :n].tolist())
            out["logp_current"].append(terms["after_bt"][b, :n].tolist())
            out["loss_token"].append(np.where(mask_t > 0, terms["loss_bt"][b, :n], 0.0).tolist())
            out["contribution"].append(float((terms["weight_bt"][b] * terms["loss_bt"][b]).sum()))
            b += 1
    return pa.table(out)


__all__ = ["COMPARED", "GroupContribution", "StepReplay", "replay_step", "token_terms"]
