"""The streaming trainer on real parts: a real tiny decoder, Orbax checkpoints, shards in a local campaign.

The SIGKILL test is the exact-resume contract: kill the trainer process at random moments, restart it, and
the final parameters are bit-identical to an uninterrupted run on the same pre-written shards, with every
group trained exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from pipelines_lib.campaign import init_campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import load_published, publish_weights
from pipelines_lib.storage import layout
from pipelines_lib.storage.shards import ShardWriter, WriterConfig
from pipelines_lib.storage.store import Store
from pipelines_lib.train.step import Precision
from pipelines_lib.train.trainer import DataTimeoutError, StreamingTrainer, train
from pipelines_lib.trajectory.synthetic import synthetic_group

ROOT = Path(__file__).resolve().parents[1]


def small_config(**trainer) -> CampaignConfig:
    base = CampaignConfig.tiny()
    model = dataclasses.replace(ModelConfig.tiny(), n_layers=1, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32,
                                d_ff=128)
    return dataclasses.replace(
        base, model=model,
        rollout=dataclasses.replace(base.rollout, eta=100),
        trainer=dataclasses.replace(base.trainer, **{
            "batch_groups": 2, "max_steps": 6, "publish_every": 2, "checkpoint_every": 3,
            "skip_zero_advantage": False, "poll_s": 0.05, "data_timeout_s": 5, **trainer}),
    )


def seed_campaign(url: str, config: CampaignConfig, n_groups: int = 14) -> Store:
    store = Store(url)
    init_campaign(store, config)
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)),
                    version=0, step=0)
    writer = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=3))
    for i in range(n_groups):
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=4, worker_id="w0", policy_version=0,
                                         seed=i, vocab_size=config.model.vocab_size, max_len=60))
    writer.flush()
    return store


def final_params(store: Store) -> list[np.ndarray]:
    from pipelines_lib.model.weights import load_weights

    done = store.read_json(layout.TRAIN_DONE)
    model = load_weights(store.uri(layout.weights_dir(done["version"])))
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def consumed_groups(store: Store) -> list[str]:
    out = []
    for name in store.list("train/consumed"):
        out.extend(g["group_id"] for g in store.read_json(f"train/consumed/{name}")["groups"])
    return out


def test_trainer_consumes_every_group_once_publishes_and_marks_done(tmp_path) -> None:
    config = small_config()
    store = seed_campaign(str(tmp_path / "c"), config)
    logs: list[str] = []
    summary = train(store, config, log=logs.append)
    assert summary["steps"] == 6 and summary["version"] == 3  # published at steps 2, 4, 6
    assert store.read_pointer(layout.WEIGHTS_LATEST)["version"] == 3
    groups = consumed_groups(store)
    assert len(groups) == 12 == len(set(groups))
    assert store.exists(layout.TRAIN_DONE)
    assert [n for n in store.list("train/checkpoints")] == ["00000002", "00000003", "00000004", "00000006"]
    assert train(store, config) == store.read_json(layout.TRAIN_DONE)  # a rerun is a no-op
    assert any("step 6/6" in line for line in logs)


def test_mixed_precision_trainer_keeps_float32_masters_and_publishes_bfloat16(tmp_path) -> None:
    base = small_config(max_steps=2)
    step = dataclasses.replace(base.trainer.step, precision=Precision(params="float32", compute="bfloat16"))
    config = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, step=step))
    store = seed_campaign(str(tmp_path / "c"), config)
    trainer = StreamingTrainer(store, config, log=lambda s: None)
    trainer.run()
    published, version = load_published(store)
    assert version == 1 and published.cfg.dtype == "bfloat16"
    masters = jax.tree.leaves(nnx.state(trainer.model, nnx.Param))
    assert {x.dtype for x in masters} == {np.dtype("float32")}
    # The published copy is the master weights rounded to bfloat16, nothing else.
    for master, served in zip(masters, jax.tree.leaves(nnx.state(published, nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(served), np.asarray(master.astype("bfloat16")))


def test_trainer_reports_what_it_waited_for(tmp_path) -> None:
    config = small_config(data_timeout_s=0.2)
    store = seed_campaign(str(tmp_path / "c"), config, n_groups=1)
    trainer = StreamingTrainer(store, config, log=lambda s: None)
    with pytest.raises(DataTimeoutError, match=r"v00000000\.\.v00000000; have 1 of 2"):
        trainer.run()
    assert trainer.idle_s > 0


_TRAIN_SCRIPT = """
import sys
from pipelines_lib.campaign import load_campaign_config
from pipelines_lib.storage.store import Store
from pipelines_lib.train.trainer import train
store = Store(sys.argv[1])
train(store, load_campaign_config(store), log=lambda s: print(s, flush=True))
"""


@pytest.mark.parametrize("n_kills", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_sigkilled_trainer_resumes_bit_identically(tmp_path, n_kills: int) -> None:
    config = small_config()
    reference = seed_campaign(str(tmp_path / "ref"), config)
    train(reference, config, log=lambda s: None)
    expected = final_params(reference)

    store = seed_campaign(str(tmp_path / "killed"), config)
    rng = random.Random(7)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    kills = 0
    while not store.exists(layout.TRAIN_DONE):
        proc = subprocess.Popen([sys.executable, "-c", _TRAIN_SCRIPT, store.url], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if kills < n_kills:
            # Let it make progress (past start-up and compilation), then kill at a random moment.
            for line in proc.stdout:
                if line.startswith("trainer: step"):
                    break
            time.sleep(rng.uniform(0.0, 0.8))
            proc.send_signal(signal.SIGKILL)
            kills += 1
        out = proc.communicate(timeout=300)[0]
        if proc.returncode not in (0, -signal.SIGKILL):
            pytest.fail(f"trainer failed:\n{out}")
    assert kills == n_kills
    groups = consumed_groups(store)
    assert len(groups) == len(set(groups)) == 12, "a group was trained twice or skipped"
    assert json.dumps([g.tolist() for g in final_params(store)]) == json.dumps([g.tolist() for g in expected])
