"""Optimizer construction: ``OptimConfig`` → an optax AdamW chain with clipping and a schedule.

The chain is ``clip_by_global_norm → AdamW(schedule)``; weight decay applies only to matrices
(ndim ≥ 2), never to norm scales or biases. ``moment_dtype: bfloat16`` stores the chain's moments in bfloat16
between updates (upcast for each update). Schedules are registered by name in ``SCHEDULES`` and
the config is validated against that registry. The returned transformation is wrapped by
``nnx.Optimizer`` in ``step.py``; the schedule is exposed so the trainer can log the learning rate
at any step without touching optimizer state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from pipelines_lib.configio import no_limit
from pipelines_lib.mesh import shard_node
from pipelines_lib.model.config import DTYPES

SCHEDULES: dict[str, Callable[[OptimConfig], optax.Schedule]] = {}


def register_schedule(
    name: str,
) -> Callable[[Callable[[OptimConfig], optax.Schedule]], Callable[[OptimConfig], optax.Schedule]]:
    def decorator(fn: Callable[[OptimConfig], optax.Schedule]) -> Callable[[OptimConfig], optax.Schedule]:
        if name in SCHEDULES:
            raise ValueError(f"schedule {name!r} is already registered")
        SCHEDULES[name] = fn
        return fn

    return decorator


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with global-norm clipping and a warmup-then-schedule learning rate."""

    lr: float = 1e-6
    """Peak learning rate (reached at the end of warmup)."""
    warmup_steps: int = 0
    """Linear warmup from 0 to ``lr`` over this many optimizer steps."""
    schedule: str = "constant"
    """A key of ``SCHEDULES``: ``constant`` or ``cosine`` (decays to ``min_lr_ratio · lr``)."""
    total_steps: int = 1000
    """Length of the schedule, warmup included; the cosine reaches its floor here."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine schedule as a fraction of ``lr``."""
    weight_decay: float = 0.0
    """Decoupled AdamW weight decay, applied to matrices only."""
    b1: float = 0.9
    """Adam first-moment decay."""
    b2: float = 0.999
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    grad_clip_norm: float = no_limit(1.0)
    """Clip the global gradient norm to this value; ``math.inf`` disables clipping."""
    moment_dtype: str = "float32"
    """Dtype Adam's moments are kept in between steps: ``bfloat16`` halves the optimizer state (two values a
    parameter) at the cost of rounding the moments to bfloat16's 8 significant bits after every update; each update
    is computed in float32 either way (``pipelines_lib.memplan`` counts what it saves)."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"OptimConfig.schedule: unknown {self.schedule!r}; choose one of {sorted(SCHEDULES)}"
            )
        if not self.lr > 0:
            raise ValueError(f"OptimConfig.lr must be > 0, got {self.lr}")
        if self.total_steps < 1:
            raise ValueError(f"OptimConfig.total_steps must be >= 1, got {self.total_steps}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(
                f"OptimConfig.warmup_steps must be in [0, total_steps={self.total_steps}], got {self.warmup_steps}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"OptimConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"OptimConfig.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.grad_clip_norm > 0:
            raise ValueError(f"OptimConfig.grad_clip_norm must be > 0, got {self.grad_clip_norm}")
        if self.moment_dtype not in DTYPES:
            raise ValueError(f"OptimConfig.moment_dtype must be one of {DTYPES}, got {self.moment_dtype!r}")

    @classmethod
    def tiny(cls) -> OptimConfig:
        """A learning rate large enough to move a tiny CPU model in a few steps."""
        return cls(lr=1e-3, warmup_steps=2, schedule="cosine", total_steps=50, weight_decay=0.01)


def _warmup_then(cfg: OptimConfig, after: optax.Schedule) -> optax.Schedule:
    if cfg.warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warmup, after], boundaries=[cfg.warmup_steps])


@register_schedule("constant")
def constant_schedule(cfg: OptimConfig) -> optax.Schedule:
    return _warmup_then(cfg, optax.constant_schedule(cfg.lr))


@register_schedule("cosine")
def cosine_schedule(cfg: OptimConfig) -> optax.Schedule:
    decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
    return _warmup_then(cfg, optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=cfg.min_lr_ratio))


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Learning rate as a function of the optimizer step count."""
    return SCHEDULES[cfg.schedule](cfg)


def _decay_mask(params: optax.Params) -> optax.Params:
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _state_in(dtype: str, inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``inner`` with its floating-point state stored in ``dtype`` between updates and computed in float32."""

    def cast(state: optax.OptState, to: str) -> optax.OptState:
        return jax.tree.map(lambda x: x.astype(to) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)

    def init(params: optax.Params) -> optax.OptState:
        return cast(inner.init(params), dtype)

    def update(updates: optax.Updates, state: optax.OptState, params: optax.Params | None = None):
        updates, state = inner.update(updates, cast(state, "float32"), params)
        return updates, cast(state, dtype)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm(grad_clip_norm) → adamw(schedule)``, its moments kept in ``cfg.moment_dtype``."""
    adamw = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip_norm),
        optax.adamw(
            make_schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=_decay_mask,
        ),
    )
    return adamw if cfg.moment_dtype == "float32" else _state_in(cfg.moment_dtype, adamw)


def make_nnx_optimizer(model: nnx.Module, cfg: OptimConfig, mesh: Mesh) -> nnx.Optimizer:
    """The ``nnx.Optimizer`` over ``model``'s ``nnx.Param``s that ``step.train_step`` updates, placed on ``mesh``.

    Adam's moments take their parameter's sharding (``pipelines_lib.mesh``); step counters are replicated.
    """
    optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)
    # optax creates its step counters uncommitted; the train step returns them committed, and jit keys its
    # cache on committedness: commit them now or the step compiles twice.
    shard_node(optimizer, mesh)
    return optimizer
