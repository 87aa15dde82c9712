"""Engine backends by ``engine.kind``: the one table through which the collect and evaluate stages open an engine.

A backend opens an engine serving published ``version`` of the campaign at ``store`` and says where later
versions' weights come from (a rollout worker swaps them in as ``weights/LATEST`` moves; an evaluation serves
its one version)::

    engine, weights = open_engine(store, version, config.engine, scratch, log)
    async with engine: ...

- ``jax``: the Orbax parameters loaded into a ``JaxEngine`` on ``EngineConfig.mesh``;
- ``vllm``: the version's Hugging Face folder served by a vLLM server (``scratch`` holds the folder unless
  ``vllm.weights_dir`` says where, and the server's log, ``vllm-server.log``).

A new backend is one function registered here with ``@register_engine(kind)`` and its kind added to
``engine.config.ENGINE_KINDS`` (which the config validates against; a test holds the two equal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from pipelines_lib.engine.api import Engine
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.engine.jax_engine import JaxEngine
from pipelines_lib.engine.vllm_engine import VllmEngine
from pipelines_lib.mesh import describe_mesh
from pipelines_lib.publish import CampaignHFWeights, CampaignWeights, load_published
from pipelines_lib.registry import registering
from pipelines_lib.storage.store import Store

Opened = tuple[contextlib.AbstractAsyncContextManager[Engine], CampaignWeights]
"""The engine to enter and where newer versions' weights come from."""
EngineBackend = Callable[[Store, int, EngineConfig, Path, Callable[[str], None]], Opened]
"""``(store, version, engine config, scratch folder, log) -> Opened``."""

ENGINE_BACKENDS: dict[str, EngineBackend] = {}
"""``engine.kind`` -> its backend."""


def register_engine(kind: str) -> Callable[[EngineBackend], EngineBackend]:
    return registering(ENGINE_BACKENDS, "engine backend", kind)


def open_engine(store: Store, version: int, config: EngineConfig, scratch: Path,
                log: Callable[[str], None] = print) -> Opened:
    """An engine of ``config.kind`` serving published ``version`` of ``store`` (not yet entered)."""
    return ENGINE_BACKENDS[config.kind](store, version, config, scratch, log)


@register_engine("jax")
def _jax_backend(store: Store, version: int, config: EngineConfig, scratch: Path,
                 log: Callable[[str], None]) -> Opened:
    model, _ = load_published(store, version)
    engine = JaxEngine(model, config, policy_version=version)
    log(f"JAX engine on mesh {describe_mesh(engine.mesh)}")
    return engine, CampaignWeights(store)


@register_engine("vllm")
def _vllm_backend(store: Store, version: int, config: EngineConfig, scratch: Path,
                  log: Callable[[str], None]) -> Opened:
    weights = CampaignHFWeights(store, Path(config.vllm.weights_dir or scratch / "hf"))
    engine = VllmEngine(config.vllm, model_dir=weights.load(version), policy_version=version,
                        max_seq_len=config.max_seq_len, log_path=scratch / "vllm-server.log", log=log)
    return engine, weights
