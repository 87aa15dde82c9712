"""Weight publication: versioned Orbax + Hugging Face folders in the campaign, and the ``weights/LATEST`` pointer.

```
publish_weights(store, model, version=N, step=S, tokenizer_dir=T)
    weights/v<N:08d>/state/, model_config.json     model.weights.save_weights (Orbax, then the config)
    weights/v<N:08d>/hf/                           model.hf_export.hf_files: config.json, safetensors, tokenizer
                                                   files of T, generation_config.json (each file create-only;
                                                   none with hf=False: trainer.publish_hf)
    weights/v<N:08d>/PUBLISHED.json                create-only commit marker {"version","path","step","published_at"}
    weights/LATEST.json                            store.advance_pointer(...) with the same payload, LAST

CampaignWeights(store).latest() -> N | None          the pointer (what rollout workers poll)
CampaignWeights(store).load(N)  -> nnx.State          what JaxEngine.swap_weights installs
CampaignHFWeights(store, cache).load(N) -> Path       a local HF folder of version N (downloaded once from gs://),
                                                   what VllmEngine.swap_weights reloads its server from
load_published(store, N=None)   -> (Decoder, N)       a published version (default LATEST) as a model
```

The HF folder lets anything outside the project serve, evaluate or share a version (vLLM, transformers,
``rollstream export-weights`` writes one anywhere). Versions published before it existed have none; the
Orbax item stays the source of truth for the trainer and the built-in engine.

Readers trust only the marker and the pointer: a folder without ``PUBLISHED.json`` is the leftover of a crashed
publish and is never loaded. A rerun of a finished publish (same version, same step) re-advances the pointer
(a no-op unless the crash came between marker and pointer) and returns the stored manifest; a second publish of
the same version from a *different* step is refused, so a version number never names two sets of weights.
A leftover without a marker is removed and written again: one trainer publishes a campaign's versions, so the
only writer of an unmarked folder is a dead earlier attempt of this same publish.

A model spanning several processes is published by all of them: each saves its own Orbax shards, the parameters
are gathered to every host for the HF folder, and process 0 alone writes the HF files, the marker and the pointer.

``gs://`` campaigns: Orbax writes through tensorstore, which does not read ``STORAGE_EMULATOR_HOST``; against an
emulator set ``TENSORSTORE_GCS_HTTP_URL`` (and ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` to skip the credential lookup),
or the save hangs. The entry points set that environment (``Settings.orbax_environment``). Every Orbax call is
bounded by the store's ``external_deadline_s`` (``Settings.orbax_deadline_s``, ``ROLLSTREAM_ORBAX_DEADLINE_S``).
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from pipelines_lib.distributed import barrier, host_copy, is_writer
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_export import hf_files
from pipelines_lib.model.weights import load_weights, save_weights
from pipelines_lib.records import Publication
from pipelines_lib.storage.errors import AlreadyExistsError, NotFoundError
from pipelines_lib.storage.layout import WEIGHTS_LATEST, weights_dir
from pipelines_lib.storage.store import Store
from pipelines_lib.utc import utc_now_iso

HF_DIR = "hf"
"""Subfolder of a weights folder holding its Hugging Face checkpoint."""


class PublishError(ValueError):
    """A publish would give one version number two different sets of weights."""


def hf_dir(version: int) -> str:
    return f"{weights_dir(version)}/{HF_DIR}"


def publish_weights(store: Store, model: Decoder, *, version: int, step: int,
                    tokenizer_dir: str | Path | None = None, hf: bool = True) -> dict[str, Any]:
    """Save ``model``'s parameters as ``weights/v<version>`` (Orbax, and HF with the tokenizer files of
    ``tokenizer_dir`` when given unless ``hf`` is false) and move ``weights/LATEST`` to it (last).

    Returns the manifest ``{"version", "path", "step", "published_at", "created"}``; ``created`` is False when
    the version was already published from the same ``step`` (a rerun). Raises ``PublishError`` if it was
    published from another step.
    """
    if step < 0:
        raise ValueError(f"publish_weights: step must be >= 0, got {step}")
    rel = weights_dir(version)
    created = False
    # Several processes (a model spanning hosts): all of them call this; they save the Orbax item together,
    # process 0 alone writes everything else. The barriers keep them on one view of the folder.
    barrier(f"publish {rel}: look")
    if not Publication.exists(store, version):
        if is_writer() and store.list(rel, include_hidden=True):
            store.fs.rm(store.uri(rel), recursive=True)  # a crashed attempt's leftovers (module docstring)
        barrier(f"publish {rel}: save")
        # Orbax has no deadline of its own (tensorstore retries a stalled request for many minutes)
        store.call_external("save weights", rel, lambda: save_weights(model, store.uri(rel)))
        if hf:
            host_model = model if jax.process_count() == 1 else nnx.merge(*_host_split(model))
            if is_writer():
                for name, data in hf_files(host_model, tokenizer_dir=tokenizer_dir).items():
                    store.create(f"{hf_dir(version)}/{name}", data)
        if is_writer():
            try:
                Publication(version=version, path=rel, step=step, published_at=utc_now_iso()).write(store)
                created = True
            except AlreadyExistsError:
                pass  # a concurrent rerun of this same publish committed first; checked below like any rerun
        barrier(f"publish {rel}: marked")
    publication = Publication.read(store, version)
    if publication.step != step:
        raise PublishError(f"{store.uri(rel)} is already published from step {publication.step}; "
                           f"refusing to publish step {step} as the same version {version}")
    if is_writer():
        publication.advance(store)
    return {**publication.to_dict(), "created": created}


def _host_split(model: Decoder) -> tuple[Any, ...]:
    """``nnx.split`` of ``model`` with its parameters copied whole to this host (a collective)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, host_copy(params), rest


class CampaignWeights:
    """The rollout ``WeightSource`` over a campaign: the LATEST pointer and published versions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def latest(self) -> int | None:
        """The newest published version, or None before the first publication."""
        latest = Publication.latest(self.store)
        return None if latest is None else latest.version

    def load_model(self, version: int, mesh: Mesh | None = None) -> Decoder:
        """Version ``version`` as a decoder; with ``mesh``, sharded on it (``model.weights.load_weights``)."""
        if not Publication.exists(self.store, version):
            raise NotFoundError("load", self.store.uri(weights_dir(version)), f"version {version} is not published")
        url = self.store.uri(weights_dir(version))
        return self.store.call_external("load weights", weights_dir(version), lambda: load_weights(url, mesh))

    def load(self, version: int) -> nnx.State:
        """Parameters of a published version, as ``JaxEngine.swap_weights`` takes them."""
        return nnx.state(self.load_model(version), nnx.Param)


class CampaignHFWeights(CampaignWeights):
    """The rollout ``WeightSource`` of an engine that loads HF folders from local disk (vLLM)."""

    def __init__(self, store: Store, cache_dir: str | Path) -> None:
        super().__init__(store)
        self.cache_dir = Path(cache_dir)

    def load(self, version: int) -> Path:  # type: ignore[override] - an HF folder, not parameters
        """A local folder holding version ``version``'s HF checkpoint: the campaign's own when it is on local
        disk, else a copy downloaded once into ``cache_dir`` (complete before it is renamed into place)."""
        if not Publication.exists(self.store, version):
            raise NotFoundError("load", self.store.uri(weights_dir(version)), f"version {version} is not published")
        names = self.store.list(hf_dir(version))
        if "config.json" not in names:
            raise NotFoundError("load", self.store.uri(hf_dir(version)),
                                f"version {version} has no HF folder (published before HF export); "
                                "write one with `rollstream export-weights`")
        local = self.store.local_path(hf_dir(version))
        if local is not None:
            return local
        out = self.cache_dir / f"v{version:08d}"
        if not out.exists():
            tmp = self.cache_dir / f".v{version:08d}.{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            for name in names:
                (tmp / name).write_bytes(self.store.read(f"{hf_dir(version)}/{name}"))
            try:
                tmp.rename(out)
            except OSError:  # another loader finished first: its copy is as good
                shutil.rmtree(tmp, ignore_errors=True)
        return out


def load_published(store: Store, version: int | None = None, mesh: Mesh | None = None) -> tuple[Decoder, int]:
    """A published version (default: the one LATEST points at) as a ``Decoder`` (sharded on ``mesh`` when
    given), and its number."""
    weights = CampaignWeights(store)
    if version is None:
        version = weights.latest()
        if version is None:
            raise NotFoundError("load", store.uri(WEIGHTS_LATEST), "no weights published yet")
    return weights.load_model(version, mesh), version


def measure_pickup_latency(store: Store, model: Decoder, *, version: int, step: int, poll_s: float = 0.05,
                           timeout_s: float = 120.0,
                           clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Publish ``model`` as ``version`` while a reader polls the campaign as a rollout worker does.

    ``publish.pickup_latency_s``: from ``publish_weights`` returning to the reader's ``CampaignWeights.latest()``
    seeing ``version`` and its ``load`` finishing (so it includes up to one ``poll_s`` of polling delay).
    Also ``publish.save_s`` (the publish call itself) and ``publish.load_s`` (the reader's load).
    """
    reader = CampaignWeights(store)
    seen = threading.Event()
    stop = threading.Event()
    marks: dict[str, float] = {}
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            while not stop.is_set():
                latest = reader.latest()
                if latest is not None and latest >= version:
                    marks["seen"] = clock()
                    reader.load(version)
                    marks["loaded"] = clock()
                    seen.set()
                    return
                stop.wait(poll_s)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            errors.append(e)
            seen.set()

    thread = threading.Thread(target=poll, name="pickup-reader", daemon=True)
    thread.start()
    started = clock()
    try:
        publish_weights(store, model, version=version, step=step)
        returned = clock()
        if not seen.wait(timeout_s):
            raise TimeoutError(f"version {version} not picked up within {timeout_s}s of publishing")
    finally:
        stop.set()
        thread.join(timeout_s)
    if errors:
        raise errors[0]
    return {
        "publish.save_s": returned - started,
        "publish.pickup_latency_s": marks["loaded"] - returned,
        "publish.load_s": marks["loaded"] - marks["seen"],
    }


__all__ = [
    "HF_DIR",
    "CampaignHFWeights",
    "CampaignWeights",
    "PublishError",
    "hf_dir",
    "load_published",
    "measure_pickup_latency",
    "publish_weights",
]
