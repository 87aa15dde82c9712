"""Colocated placement: one process runs rollouts, trainer and evaluation, the engine taking each new version
from the trainer's device memory, and the campaign folder it leaves is the one separate placement leaves."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
import yaml
from flax import nnx

from bench.scale import fake_devices_env
from bench.tpu import QUICK_CAMPAIGN
from flows.campaign import campaign
from harness.fixtures import seed_trainer_campaign, small_trainer_config
from pipelines_lib.cli import main
from pipelines_lib.config import CampaignConfig
from pipelines_lib.configio import nest_dotted, parse_overrides
from pipelines_lib.hints import hint_command
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import CampaignWeights, publish_weights
from pipelines_lib.records import AuditRecord, StopRequest
from pipelines_lib.stages import colocated
from pipelines_lib.stages.colocated import DeviceWeights, run_colocated
from pipelines_lib.stages.train import train
from pipelines_lib.storage.errors import NotFoundError
from pipelines_lib.storage.store import Store


def record_kinds(store: Store) -> set[str]:
    """Every object's name with numbers and per-start nonces replaced, to the depth the layout names (Orbax's
    own files below a ``state`` item are its business); Prefect run records and telemetry, which name the
    process that wrote them, are left out."""
    kinds = set()
    for path in store.fs.find(store.uri("")):
        rel = path.split(store.uri("").split("://", 1)[-1].rstrip("/") + "/", 1)[1]
        if rel.startswith(("runs/", "telemetry/", "view/")):
            continue
        rel = "/".join(rel.split("/")[:3])
        kinds.add(re.sub(r"\d+", "N", re.sub(r"[0-9a-f]{6,}", "H", rel)))
    return kinds


def test_device_weights_serve_a_copy_that_outlives_the_trainers_buffers(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    model = Decoder(CampaignConfig.preset("smoke").model, rngs=nnx.Rngs(0))
    expected = jax.tree.map(lambda x: x.copy(), nnx.state(model, nnx.Param))
    weights = DeviceWeights(store)
    weights.hand_over(3, model)
    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        leaf.delete()  # what the trainer's next step does to them (donation)
    served = weights.load(3)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), served, expected))
    assert weights.handed_over == 1
    with pytest.raises(NotFoundError, match="version 2 is not published"):
        weights.load(2)  # a version never handed over comes from the folder


def test_device_weights_follow_the_campaign_pointer_and_load_versions_they_never_saw(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    model = Decoder(CampaignConfig.preset("smoke").model, rngs=nnx.Rngs(1))
    weights = DeviceWeights(store)
    assert weights.latest() is None
    publish_weights(store, model, version=0, step=0)
    assert weights.latest() == 0
    loaded = weights.load(0)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), loaded, nnx.state(model, nnx.Param)))
    assert weights.handed_over == 0


def test_device_weights_ahead_serve_a_version_from_its_hand_over_and_say_storage_holds_it_only_once_stored(
        tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    model = Decoder(CampaignConfig.preset("smoke").model, rngs=nnx.Rngs(2))
    publish_weights(store, model, version=0, step=0)
    ahead, behind = DeviceWeights(store, ahead=True), DeviceWeights(store)
    woken: list[tuple[int | None, int | None]] = []
    ahead.watch(lambda: woken.append((ahead.latest(), ahead.stored())))
    behind.watch(lambda: woken.append((None, None)))
    ahead.hand_over(1, model)
    behind.hand_over(1, model)
    assert woken == [(1, 0)]  # woken at the hand-over: version 1 may be served, storage holds 0
    assert (behind.latest(), behind.stored()) == (0, 0)  # without ahead, a version waits for the pointer
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), ahead.load(1), nnx.state(model, nnx.Param)))
    publish_weights(store, model, version=1, step=2)
    ahead.pointer_moved(1)
    assert woken[-1] == (1, 1)


def test_run_colocated_refuses_a_separate_placement_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs placement='colocated', got 'separate'"):
        run_colocated(Store(str(tmp_path / "c")), small_trainer_config(2))


def test_colocated_placement_needs_the_jax_engine() -> None:
    with pytest.raises(ValueError, match="needs engine.kind='jax'.*'vllm'"):
        CampaignConfig.tiny().with_overrides({"placement": "colocated", "engine.kind": "vllm"})


def test_colocated_and_separate_campaigns_leave_folders_the_audit_cannot_tell_apart(
        prefect_api: str, tmp_path: Path) -> None:
    results, stores, audits = {}, {}, {}
    for placement in ("separate", "colocated"):
        path = tmp_path / f"{placement}.yaml"
        path.write_text(yaml.safe_dump({**CampaignConfig.preset("smoke").to_dict(), "placement": placement}))
        url = str(tmp_path / placement)
        results[placement] = campaign(url, config_path=str(path), poll_s=0.5)
        stores[placement] = Store(url)
        audits[placement] = AuditRecord.at(stores[placement], results[placement]["audit"]["report"]).report
    colocated = results["colocated"]["colocated"]
    assert colocated["train"]["steps"] == 4 and colocated["train"]["version"] == 2
    assert sorted(colocated["evaluate"]) == [0, 1, 2]
    assert all(c["stop_reason"] == "done marker" for c in colocated["collect"])
    assert colocated["handed_over"] >= 1  # the engine swapped in a version from the trainer's device memory
    for placement, result in results.items():
        assert result["audit"]["ok"] and result["audit"]["violations"] == 0, placement
    # The same records, by kind; the same report, field by field, and the same verdict on each check.
    kinds = {placement: record_kinds(store) for placement, store in stores.items()}
    assert kinds["colocated"] ^ kinds["separate"] == set()
    assert audits["colocated"].keys() == audits["separate"].keys()
    assert audits["colocated"]["violation_counts"] == audits["separate"]["violation_counts"] == {}
    same = {placement: (sorted(w.split(".")[0] for w in a["by_worker"]), a["evals"], a["bad_files"],
                        [p["version"] for p in a["lineage"]["published"]], a["lineage"]["last_step"])
            for placement, a in audits.items()}
    assert same["colocated"] == same["separate"]


def test_run_colocated_command_runs_the_tpu_demo_preset_without_prefect_and_continues_when_rerun(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, config = str(tmp_path / "tpu_demo"), tmp_path / "quick.yaml"
    config.write_text(yaml.safe_dump(nest_dotted(parse_overrides(QUICK_CAMPAIGN))))
    args = ["run-colocated", url, "--preset", "tpu_demo", "--config", str(config), "--set", "trainer.max_steps=2"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["audit_ok"] and set(first["greedy_success"]) == {"0", "1"}  # eval.versions: ends
    assert main(args) == 0  # a rerun of the finished campaign finds every marker and trains nothing
    again = json.loads(capsys.readouterr().out)
    assert again["greedy_success"] == first["greedy_success"] and again["handed_over"] == 0
    assert CampaignConfig.from_mapping(json.loads(Path(url, "campaign.json").read_text())["config"]).placement \
        == "colocated"


def test_the_trainer_hands_each_version_over_before_its_pointer_moves_wakes_watchers_after_and_the_engine_gets_it(
        tmp_path: Path) -> None:
    config = small_trainer_config(4)  # publishes v1 at step 2, v2 at step 4
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 8)
    weights = DeviceWeights(store)
    latest_at_hand_over: list[tuple[int, int | None]] = []

    def hand_over(version: int, model: Decoder) -> None:
        latest_at_hand_over.append((version, weights.latest()))
        weights.hand_over(version, model)

    woken: list[int | None] = []
    unwatch = weights.watch(lambda: woken.append(weights.latest()))
    train(store, config, on_publish=hand_over, on_published=weights.pointer_moved, log=lambda line: None)
    assert latest_at_hand_over == [(1, 0), (2, 1)]  # the folder did not name the version yet
    assert woken == [1, 2]  # each wake-up came once the pointer named the version
    unwatch()
    weights.pointer_moved(3)
    assert woken == [1, 2]
    served = weights.load(2)
    published = CampaignWeights(store).load(2)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), served, published))
    assert weights.handed_over == 1


def test_a_failed_rollout_worker_stops_the_colocated_trainer_with_its_error(tmp_path: Path, monkeypatch) -> None:
    # The trainer's own deadline (data_timeout_s) is 120 s and would name missing groups; the worker's error must
    # end the campaign at the trainer's next poll instead, and the error must be the worker's.
    config = dataclasses.replace(small_trainer_config(4, data_timeout_s=120), placement="colocated")
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 0)

    def failing_collect(*args, **kwargs):
        time.sleep(0.2)  # the trainer is waiting for groups by then
        raise OSError("no space left on device")

    monkeypatch.setattr(colocated, "collect", failing_collect)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="colocated rollout worker failed: OSError: no space left") as err:
        run_colocated(store, config, log=lambda line: None)
    assert time.monotonic() - t0 < 60, "the trainer waited for groups after its worker failed"
    assert isinstance(err.value.__cause__, OSError)
    assert StopRequest.times(store), "the other workers were not asked to stop"


@pytest.mark.slow
def test_a_colocated_campaign_shares_two_devices_between_an_fsdp_trainer_and_a_tensor_parallel_engine(
        tmp_path: Path) -> None:
    # One process over every device of a host (a single-host slice): the trainer's and the engine's meshes span
    # the same two devices, and versions still pass from one to the other in device memory.
    url = str(tmp_path / "c")
    args = [sys.executable, "-m", "pipelines_lib.cli", "run-colocated", url, "--preset", "smoke", "--set",
            "trainer.mesh.fsdp=2", "--set", "engine.mesh.tensor=2", "--set", "workers=1"]
    done = subprocess.run(args, env=fake_devices_env(2), capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer: mesh data=1 × fsdp=2 × tensor=1 (2 devices)" in done.stderr
    assert "rollout: JAX engine on mesh data=1 × fsdp=1 × tensor=2 (2 devices)" in done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["audit_ok"] and out["handed_over"] >= 1


def test_run_colocated_with_another_config_refuses_in_one_line_naming_the_recover_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "c")
    seed_trainer_campaign(url, dataclasses.replace(small_trainer_config(2), placement="colocated"), 0)
    before = sorted(p.name for p in Path(url).iterdir())
    assert main(["run-colocated", url, "--preset", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"rollstream run-colocated: file://{url}/campaign.json: "
                                                        "this campaign was started with a different config")
    assert err.endswith(f"to continue it with its own: {hint_command(['recover', f'file://{url}'])}")
    assert sorted(p.name for p in Path(url).iterdir()) == before
