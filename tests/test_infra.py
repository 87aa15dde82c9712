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
    assert resources_for("train", config, accelerator="v5e").accelerators > train.accelerators


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
    assert nightly["schedules"][0]["active"] is False  # armed only on request (rollstream deploy --arm)
    assert "{date}" in nightly["parameters"]["campaign_url"]
    CampaignConfig.from_yaml(INFRA.parent / nightly["parameters"]["config_path"])


@pytest.mark.parametrize("template", ["process-job-template.json", "kubernetes-cpu-job-template.json",
                                      "kubernetes-accel-job-template.json", "kubernetes-vllm-job-template.json",
                                      "kubernetes-tpu-slice-job-template.json"])
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


def _render(template: str, variables: dict) -> dict:
    """The Kubernetes Job a Prefect worker would create from ``template`` with ``variables`` (and its defaults)."""
    from prefect.utilities.templating import apply_values

    spec = json.loads((INFRA / template).read_text())
    values = {k: v["default"] for k, v in spec["variables"]["properties"].items() if "default" in v}
    values |= {"command": "prefect flow-run execute", "campaign_url": "gs://bucket/c1", **variables}
    return apply_values(spec["job_configuration"]["job_manifest"], values)


# v5e-16 and v6e-64: 4 chips per host; v5p-8 (2x2x2): 2 hosts of 4; v5e-8 (2x4) and v6e-8: one host of 8.
@pytest.mark.parametrize(("accelerator", "topology", "hosts", "chips_per_host", "mesh"), [
    ("v5e", "4x4", 4, 4, (1, 16, 1)),
    ("v6e", "8x8", 16, 4, (1, 64, 1)),
    ("v5p", "2x2x2", 2, 4, (1, 8, 1)),
    ("v5e", "2x4", 1, 8, (1, 8, 1)),
])
def test_the_tpu_slice_template_renders_one_pod_per_host_with_its_chips(accelerator: str, topology: str, hosts: int,
                                                                        chips_per_host: int, mesh: tuple) -> None:
    config = TINY.with_overrides({"trainer.mesh.fsdp": -1, "distributed.from_environment": True})
    r = resources_for("train", config, accelerator=accelerator, topology=topology)
    assert (r.device_slice.hosts, r.device_slice.chips_per_host, r.accelerators) == (hosts, chips_per_host,
                                                                                     hosts * chips_per_host)
    assert r.mesh == mesh  # the trainer's fsdp=-1 spans every chip of every host
    job = _render("kubernetes-tpu-slice-job-template.json", r.job_variables() | r.slice_variables())
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == hosts
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": r.slice_variables()["tpu_accelerator"],
                                   "cloud.google.com/gke-tpu-topology": topology}
    assert pod["subdomain"] == "rollstream-tpu-slice"
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["google.com/tpu"] == chips_per_host
    # Pod 0 runs the flow run (process 0); the others join it as processes 1.. of the same campaign.
    assert "exec prefect flow-run execute;" in container["args"][0]
    assert "pipelines_lib.cli train gs://bucket/c1" in container["args"][0]


def test_the_gpu_template_renders_one_node_with_all_its_gpus() -> None:
    config = TINY.with_overrides({"trainer.mesh.fsdp": -1, "engine.mesh.tensor": 8})
    train, collect = (resources_for(s, config, accelerator="H100", topology="8") for s in ("train", "collect"))
    assert (train.mesh, collect.mesh, train.device_slice.hosts) == ((1, 8, 1), (1, 1, 8), 1)
    job = _render("kubernetes-accel-job-template.json", train.job_variables() | train.slice_variables())
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"accelerator": "v4"}, r"unknown accelerator 'v4'; valid: \['A100', 'H100', 'v5e', 'v5p', 'v6e'\]"),
    ({"accelerator": "v5e", "topology": "4by4"}, "topology '4by4' is not AxB or AxBxC chips"),
    ({"accelerator": "H100", "topology": "16"}, "16 GPUs do not fit one node of 8"),
    ({"accelerator": "v5e", "topology": "2x2", "mesh": 8}, "needs 8 devices, have 4"),
])
def test_resources_refuse_unknown_accelerators_bad_topologies_and_meshes_that_do_not_fit(kwargs: dict,
                                                                                        match: str) -> None:
    config = TINY.with_overrides({"trainer.mesh.fsdp": kwargs.pop("mesh", 1)})
    with pytest.raises(ValueError, match=match):
        resources_for("train", config, **kwargs)


def test_a_slice_too_small_for_the_model_is_refused() -> None:
    llama8b = ModelConfig(vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                          d_ff=14_336, max_seq_len=8192, dtype="bfloat16")
    config = CampaignConfig.from_mapping({"model": llama8b.to_dict()}, base=TINY)
    with pytest.raises(ValueError, match=r"v5e 2x2 has 4 × 16 GiB"):
        resources_for("train", config, accelerator="v5e", topology="2x2")
    assert resources_for("train", config, accelerator="v5e").device_slice.hosts > 1


def test_prefect_yaml_smoke_campaign_runs_on_request_only_and_heal_answers_crashes_of_orchestrating_flows() -> None:
    from flows.campaign import campaign
    from flows.heal import heal
    from flows.recover import recover
    from flows.runs import WATCH_TAG

    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    smoke = deployments["smoke"]
    assert "schedules" not in smoke and smoke["parameters"]["preset"] == "smoke"
    assert "{datetime}" in smoke["parameters"]["campaign_url"]
    assert deployments["heal"]["entrypoint"] == "flows/heal.py:heal"
    [trigger] = deployments["heal"]["triggers"]
    assert trigger["expect"] == ["prefect.flow-run.Crashed"]
    assert trigger["match_related"]["prefect.resource.name"] == [campaign.name, recover.name]
    assert trigger["parameters"] == {"flow_run_id": "{{ event.resource.id }}"}
    assert heal.name not in trigger["match_related"]["prefect.resource.name"]  # a crashed healer is not healed
    # Every deployment carries the tag the zombie automation watches.
    assert all(WATCH_TAG in d["tags"] for d in spec["deployments"])
