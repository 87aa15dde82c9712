"""A whole tiny campaign on ``engine.kind: vllm``: warm start, a rollout worker serving from a vLLM server it
launches, the streaming trainer publishing after each of its two steps (so the worker reloads the server twice), and a clean audit.

The model is the tiny preset with untied embeddings (the tied case is ``test_vllm_engine.py``'s). The mismatch
metric is what proves the reloads: tokens the trainer consumed were sampled by the server, and their recorded
logprobs agree with the trainer's own on the same version within the engines' tolerance only if the server was
really serving that version.
"""

from __future__ import annotations

import threading

from pipelines_lib.audit import audit_campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import prep
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.stages.collect import collect
from pipelines_lib.stages.train import train
from pipelines_lib.stages.warm_start import warm_start
from pipelines_lib.storage import layout
from pipelines_lib.storage.shards import read_shard
from pipelines_lib.storage.store import Store
from tests.test_vllm_engine import EAGER, vllm_python


def vllm_campaign_config() -> CampaignConfig:
    base = CampaignConfig.tiny()
    return base.with_overrides({
        "model.tie_embeddings": False,
        "engine.kind": "vllm",
        "engine.vllm.python": str(vllm_python()),
        "engine.vllm.max_num_seqs": 16, "engine.vllm.extra_args": list(EAGER),
        "sft.steps": 20, "sft.n_demos": 64,
        "dataset.n_train": 64,
        "rollout.group_size": 4, "rollout.max_concurrency": 16,
        # A 20-step warm start rarely solves a task: groups whose rewards are all zero still train (zero
        # advantage, but the mismatch metric is over their tokens all the same).
        "trainer.skip_zero_advantage": False, "rollout.max_groups_per_version": 2,
        # Two steps, each published: the fewest that make the worker reload its server twice.
        "trainer.max_steps": 2, "trainer.batch_groups": 2, "trainer.publish_every": 1, "trainer.checkpoint_every": 2,
        "rollout.eta": 1,
    })


def test_a_tiny_campaign_on_vllm_trains_publishes_reloads_and_audits_clean(tmp_path) -> None:
    store = Store(str(tmp_path / "campaign"))
    config = vllm_campaign_config()
    init_campaign(store, config)
    prep(store, config.dataset)
    warm_start(store, config, log=lambda _: None)
    logs: list[str] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            collect(store, config, worker="w0", worker_index=0, num_workers=1, log=logs.append)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    thread = threading.Thread(target=worker, name="rollout-w0")
    thread.start()
    try:
        train(store, config, log=lambda _: None)
    finally:
        thread.join(600)
    assert not errors, errors
    assert store.read_pointer(layout.WEIGHTS_LATEST)["version"] == 2
    assert store.exists("weights/v00000002/hf/config.json")
    versions = set()
    for vdir in store.list(layout.TRAJECTORIES):
        for name in store.list(f"{layout.TRAJECTORIES}/{vdir}"):
            table, _ = read_shard(store, f"{layout.TRAJECTORIES}/{vdir}/{name}")
            versions |= {v for row in table.column("policy_version").to_pylist() for v in row if v >= 0}
    assert versions >= {0, 1}, versions  # the worker reloaded its server and stamped the new version
    assert any(store.list("telemetry")) and any(n.startswith("engine-w0.") for n in store.list("telemetry"))
    mismatches = []
    for name in store.list("train/consumed"):
        record = store.read_json(f"train/consumed/{name}")
        if all(g["staleness"] == 0 for g in record["groups"]):  # fresh data: trainer and sampler share weights
            mismatches.append(record["metrics"]["prox_behav_logp_abs_diff_p99"])
    assert mismatches and max(mismatches) < 1e-3, mismatches
    assert audit_campaign(store).ok
