"""Inference engines: the token-in/token-out contract (``api``) and the continuous-batching JAX engine."""

from pipelines_lib.engine.api import FINISH_REASONS, Completion, Engine, SamplingParams
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.jax_engine import EngineClosedError, JaxEngine

__all__ = [
    "FINISH_REASONS",
    "Completion",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "JaxEngine",
    "SamplingParams",
]
