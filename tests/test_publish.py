"""Weight publication: Orbax folders + create-only marker + the LATEST pointer, on a local folder and on a real
GCS-API emulator; CampaignWeights as the rollout WeightSource; the pickup-latency measurement."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx

from pipelines_lib.engine import EngineConfig, JaxEngine
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import (
    CampaignHFWeights,
    CampaignWeights,
    PublishError,
    hf_dir,
    load_published,
    measure_pickup_latency,
    publish_weights,
)
from pipelines_lib.records import Publication
from pipelines_lib.storage.errors import NotFoundError
from pipelines_lib.storage.layout import published_marker, weights_dir
from pipelines_lib.storage.store import Store

SMALL = dataclasses.replace(
    ModelConfig.tiny(), vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
    max_seq_len=32,
)


@functools.cache
def _model(seed: int) -> Decoder:
    return Decoder(SMALL, rngs=nnx.Rngs(seed))


def model(seed: int = 0) -> Decoder:
    return nnx.clone(_model(seed))


def leaves(params: object) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def assert_same_params(a: object, b: object) -> None:
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def test_publish_then_load_round_trips_params_exactly(local_store: Store) -> None:
    m = model()
    manifest = publish_weights(local_store, m, version=0, step=0)
    assert manifest["version"] == 0 and manifest["step"] == 0 and manifest["created"]
    assert manifest["path"] == weights_dir(0)

    loaded, version = load_published(local_store)
    assert version == 0
    assert loaded.cfg == SMALL
    assert_same_params(nnx.state(loaded, nnx.Param), nnx.state(m, nnx.Param))
    assert_same_params(CampaignWeights(local_store).load(0), nnx.state(m, nnx.Param))


def test_a_version_published_without_its_hf_folder_loads_and_names_the_missing_folder_to_vllm(
        local_store: Store, tmp_path) -> None:
    m = model()
    publish_weights(local_store, m, version=0, step=0, hf=False)
    assert local_store.list(hf_dir(0)) == [] and local_store.list(weights_dir(0))
    assert_same_params(nnx.state(load_published(local_store)[0], nnx.Param), nnx.state(m, nnx.Param))
    with pytest.raises(NotFoundError, match="version 0 has no HF folder"):
        CampaignHFWeights(local_store, tmp_path / "hf").load(0)


def test_pointer_moves_forward_only(local_store: Store) -> None:
    weights = CampaignWeights(local_store)
    assert weights.latest() is None
    publish_weights(local_store, model(0), version=0, step=0)
    publish_weights(local_store, model(1), version=2, step=4)
    assert weights.latest() == 2
    pointer = Publication.latest(local_store)
    assert pointer is not None
    assert (pointer.version, pointer.path, pointer.step) == (2, weights_dir(2), 4)
    assert pointer.published_at
    # A late publish of an older version lands but never lowers the pointer.
    publish_weights(local_store, model(0), version=1, step=2)
    assert weights.latest() == 2
    assert_same_params(weights.load(1), nnx.state(model(0), nnx.Param))
    assert_same_params(load_published(local_store)[0], model(1))


def test_rerun_of_publish_is_a_no_op(local_store: Store) -> None:
    first = publish_weights(local_store, model(0), version=0, step=0)
    marker_before = local_store.read(published_marker(0))
    again = publish_weights(local_store, model(1), version=0, step=0)
    assert not again["created"]
    assert {k: v for k, v in again.items() if k != "created"} == {k: v for k, v in first.items() if k != "created"}
    assert local_store.read(published_marker(0)) == marker_before
    assert_same_params(CampaignWeights(local_store).load(0), nnx.state(model(0), nnx.Param))


def test_publishing_a_version_again_from_another_step_is_refused(local_store: Store) -> None:
    publish_weights(local_store, model(0), version=3, step=6)
    with pytest.raises(PublishError, match="already published from step 6"):
        publish_weights(local_store, model(1), version=3, step=7)


def test_leftover_of_a_crashed_publish_is_replaced_and_never_loaded(local_store: Store) -> None:
    # A crash after the Orbax item but before the marker: the folder is there, the version is not published.
    from pipelines_lib.model.weights import save_weights

    save_weights(model(1), local_store.uri(weights_dir(0)))
    with pytest.raises(NotFoundError, match="not published"):
        CampaignWeights(local_store).load(0)
    publish_weights(local_store, model(0), version=0, step=0)
    assert_same_params(CampaignWeights(local_store).load(0), nnx.state(model(0), nnx.Param))


def test_load_before_any_publication_names_the_pointer(local_store: Store) -> None:
    with pytest.raises(NotFoundError, match="no weights published yet"):
        load_published(local_store)


def test_loaded_params_install_into_the_engine(local_store: Store) -> None:
    import asyncio

    publish_weights(local_store, model(1), version=1, step=2)
    engine = JaxEngine(model(0), EngineConfig(num_slots=1, max_seq_len=32, prefill_buckets=(8,)))
    engine.swap_weights(CampaignWeights(local_store).load(1), 1)
    assert engine.policy_version == 1
    asyncio.run(engine.close())


def test_publish_and_load_on_the_gcs_emulator(gcs_store: Store, gcs_emulator: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Orbax writes through tensorstore, which ignores STORAGE_EMULATOR_HOST (used by etils' gcsfs backend).
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", gcs_emulator)
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "anon")
    m = model()
    manifest = publish_weights(gcs_store, m, version=0, step=0)
    assert manifest["created"]
    assert gcs_store.exists(f"{weights_dir(0)}/model_config.json")
    assert CampaignWeights(gcs_store).latest() == 0
    loaded, version = load_published(gcs_store)
    assert version == 0
    assert_same_params(nnx.state(loaded, nnx.Param), nnx.state(m, nnx.Param))
    assert not publish_weights(gcs_store, m, version=0, step=0)["created"]


def test_pickup_latency_is_measured_from_publish_return_to_loaded(local_store: Store) -> None:
    publish_weights(local_store, model(0), version=0, step=0)
    figures = measure_pickup_latency(local_store, model(1), version=1, step=2, poll_s=0.01)
    assert set(figures) == {"publish.save_s", "publish.pickup_latency_s", "publish.load_s"}
    # The reader may see the pointer a moment before publish_weights returns, so load_s can exceed the latency.
    assert figures["publish.save_s"] > 0 and figures["publish.load_s"] > 0
    assert figures["publish.pickup_latency_s"] > 0  # how fast is the publish benchmark's business
    assert CampaignWeights(local_store).latest() == 1
