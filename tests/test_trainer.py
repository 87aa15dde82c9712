"""The streaming trainer on real parts: a real tiny decoder, Orbax checkpoints, shards in a local campaign.

The SIGKILL test is the exact-resume contract: kill the trainer process at random moments, restart it, and
the final parameters are bit-identical to an uninterrupted run on the same pre-written shards, with every
group trained exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drills.fixtures import consumed_group_ids, final_params, seed_trainer_campaign, small_trainer_config
from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import DoneMarker, Publication
from pipelines_lib.stages.train import train, trainer_for
from pipelines_lib.storage import layout
from pipelines_lib.train.checkpoint import committed_checkpoints
from pipelines_lib.train.trainer import DataTimeoutError

ROOT = Path(__file__).resolve().parents[1]


def small_config(**trainer: object) -> CampaignConfig:
    return small_trainer_config(6, eta=100, **{"data_timeout_s": 5, **trainer})


def test_trainer_consumes_every_group_once_publishes_and_marks_done(tmp_path) -> None:
    config = small_config()
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 14)
    logs: list[str] = []
    summary = train(store, config, log=logs.append)
    assert summary["steps"] == 6 and summary["version"] == 3  # published at steps 2, 4, 6
    latest = Publication.latest(store)
    assert latest is not None and latest.version == 3
    groups = consumed_group_ids(store)
    assert len(groups) == 12 == len(set(groups))
    assert DoneMarker.exists(store)
    assert committed_checkpoints(store) == [layout.checkpoint_dir(s) for s in (2, 3, 4, 6)]
    assert train(store, config) == DoneMarker.read(store).to_dict()  # a rerun is a no-op
    assert any("step 6/6" in line for line in logs)


def test_trainer_reports_what_it_waited_for(tmp_path) -> None:
    config = small_config(data_timeout_s=0.2)
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 1)
    trainer = trainer_for(store, config, log=lambda s: None)
    with pytest.raises(DataTimeoutError, match=r"v00000000\.\.v00000000; have 1 of 2"):
        trainer.run()
    assert trainer.idle_s > 0


_TRAIN_SCRIPT = """
import sys
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.storage.store import Store
from pipelines_lib.stages.train import train
store = Store(sys.argv[1])
train(store, load_campaign_config(store), log=lambda s: print(s, flush=True))
"""


@pytest.mark.parametrize("n_kills", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_sigkilled_trainer_resumes_bit_identically(tmp_path, n_kills: int) -> None:
    config = small_config()
    reference = seed_trainer_campaign(str(tmp_path / "ref"), config, 14)
    train(reference, config, log=lambda s: None)
    expected = final_params(reference)

    store = seed_trainer_campaign(str(tmp_path / "killed"), config, 14)
    rng = random.Random(7)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    kills = 0
    while not DoneMarker.exists(store):
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
    groups = consumed_group_ids(store)
    assert len(groups) == len(set(groups)) == 12, "a group was trained twice or skipped"
    assert final_params(store) == expected
