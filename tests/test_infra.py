"""Infrastructure as data: resource sizing (pure) and the deployment / work-pool files parse and agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipelines_lib.config import CampaignConfig
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.stages.resources import ACCEL_POOL, CPU_POOL, kv_cache_bytes, param_count
from pipelines_lib.stages.table import STAGE_NAMES, resources_for

INFRA = Path(__file__).resolve().parents[1] / "infra"
TINY = CampaignConfig.tiny()


def test_param_count_of_the_tiny_model_by_hand() -> None:
    # tied embedding 512*128; per layer: q,o 2*128*4*32, k,v 2*128*2*32, gated MLP 3*128*384, 2 norms of 128
    per_layer = 2 * 128 * 4 * 32 + 2 * 128 * 2 * 32 + 3 * 128 * 384 + 2 * 128
    assert param_count(ModelConfig.tiny()) == 512 * 128 + 4 * per_layer + 128 == 853_120


def test_kv_cache_of_the_tiny_engine_by_hand() -> None:
    # 16 slots x 128 positions x 4 layers x (K and V) x 2 kv heads x 32 dims x 4 bytes = 4 MiB
    assert kv_cache_bytes(ModelConfig.tiny(), sequences=16, seq_len=128) == 16 * 128 * 4 * 2 * 2 * 32 * 4 == 4 * 2**20


@pytest.mark.parametrize("stage", ["prep", "evaluate", "audit"])
def test_cpu_stages_go_to_the_cpu_pool_without_a_device_slot(stage: str) -> None:
    r = resources_for(stage, TINY)
    assert (r.pool, r.accelerators, r.accelerator, r.concurrency_key) == (CPU_POOL, 0, None, None)


def test_accelerator_stages_hold_one_slot_per_worker() -> None:
    assert resources_for("collect", TINY, worker_index=1).concurrency_key == "gpu:rollout1"
    assert resources_for("train", TINY).concurrency_key == "gpu:trainer"
    assert resources_for("warm_start", TINY).concurrency_key == "gpu:trainer"
    assert {resources_for(s, TINY).pool for s in ("warm_start", "collect", "train")} == {ACCEL_POOL}


def test_an_8b_model_needs_more_chips_to_train_than_to_sample() -> None:
    llama8b = ModelConfig(vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                          d_ff=14_336, max_seq_len=8192, dtype="bfloat16")
    config = CampaignConfig.from_mapping({"model": llama8b.to_dict()}, base=TINY)
    assert 8.0e9 < param_count(llama8b) < 8.1e9
    train, collect = resources_for("train", config), resources_for("collect", config)
    # 8.03e9 params x (2 weights + 4 grads + 8 Adam) bytes = 112 GB before activations: two 80 GiB chips
    assert train.accelerators >= 2 > collect.accelerators == 1
    assert resources_for("train", config, device_memory_gib=16).accelerators > train.accelerators


def test_resources_name_the_valid_stages_for_an_unknown_one() -> None:
    with pytest.raises(ValueError, match="valid: .*prep"):
        resources_for("publish", TINY)


@pytest.mark.parametrize(("name", "root"), [("nightly", "gs://{{ $ROLLSTREAM_BUCKET }}/"),
                                          ("nightly-local", "{{ $ROLLSTREAM_HOME }}/runs/")])
def test_prefect_yaml_schedules_a_nightly_campaign_over_the_stage_deployments(name: str, root: str) -> None:
    # The per-stage deployments are checked against the stage table in tests/test_stage_table.py.
    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    nightly = deployments[name]
    assert nightly["parameters"]["campaign_url"].startswith(root)
    assert nightly["entrypoint"] == "flows/campaign.py:campaign"
    assert nightly["schedules"][0]["cron"] == "0 2 * * *" and nightly["parameters"]["use_deployments"] is True
    assert "{date}" in nightly["parameters"]["campaign_url"]
    CampaignConfig.from_yaml(INFRA.parent / nightly["parameters"]["config_path"])


@pytest.mark.parametrize("template", ["process-job-template.json", "kubernetes-cpu-job-template.json",
                                      "kubernetes-accel-job-template.json", "kubernetes-vllm-job-template.json"])
def test_every_work_pool_template_declares_the_resource_variables(template: str) -> None:
    spec = json.loads((INFRA / template).read_text())
    assert set(resources_for("train", TINY).job_variables()) <= set(spec["variables"]["properties"])
    assert "job_configuration" in spec


def test_all_stages_are_sized() -> None:
    assert all(resources_for(s, TINY).memory_gib >= 2 for s in STAGE_NAMES)


def test_the_vllm_sidecar_listens_only_inside_the_pod_and_shares_the_weights_volume() -> None:
    spec = json.loads((INFRA / "kubernetes-vllm-job-template.json").read_text())
    pod = spec["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    worker, sidecar = pod["containers"]
    args = sidecar["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1" and "ports" not in sidecar
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in sidecar["env"]
    assert "rollstream_vllm.WorkerExtension" in args and "processed_logprobs" in args
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert mounts["weights"] == {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}["weights"]
