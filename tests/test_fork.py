"""Forking a finished campaign from a checkpoint: a new folder that trains on from the parent's exact state.

One small trainer campaign (4 steps of 2 synthetic groups, checkpoints at steps 2 and 4, version 1 published at
step 2) is the parent. A fork from step 2 with η = 0 gets the same four groups its parent trained on at steps
3 and 4, written as a rollout worker on version 1 would; restoring the parent's parameters, optimiser state and
RNG exactly makes the fork's steps 3 and 4 the same floats as the parent's, and its final parameters equal. A
fork from step 3 (no checkpoint there) re-trains step 3 from checkpoint 2 and lands on the same floats too.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from drills.fixtures import final_params, seed_trainer_campaign, small_trainer_config
from pipelines_lib.audit.view import build_view, render_html
from pipelines_lib.cli import main
from pipelines_lib.records import CampaignManifest, ConsumptionLog, DoneMarker, consumption_steps
from pipelines_lib.stages.audit import audit
from pipelines_lib.stages.campaign import campaign_status, load_campaign_config
from pipelines_lib.stages.fork import fork_campaign
from pipelines_lib.stages.train import train, trainer_for
from pipelines_lib.storage.shards import ShardWriter, WriterConfig
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.synthetic import synthetic_group


def checksums(store: Store) -> dict[str, str]:
    return {rel: hashlib.sha256(store.read(rel)).hexdigest() for rel in store.walk()}


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Store:
    config = small_trainer_config(4, checkpoint_every=4)
    store = seed_trainer_campaign(str(tmp_path_factory.mktemp("fork") / "parent"), config, 8)
    train(store, config, log=lambda _: None)
    return store


def write_groups(store: Store, seeds: range, *, version: int) -> None:
    """The synthetic groups ``seeds`` (as ``seed_trainer_campaign`` makes them), from a worker on ``version``."""
    vocab = load_campaign_config(store).model.vocab_size
    writer = ShardWriter(store, worker_id="w1", config=WriterConfig(max_groups=3))
    for i in seeds:
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=4, worker_id="w1", policy_version=version,
                                         seed=i, vocab_size=vocab, max_len=60))
    writer.flush()


def test_a_fork_with_another_eta_resumes_the_parents_exact_state_and_never_writes_into_it(
        parent: Store, tmp_path) -> None:
    before = checksums(parent)
    fork = Store(str(tmp_path / "fork"))
    result = fork_campaign(parent, 2, fork, {"rollout.eta": 0})
    assert result["created"]
    manifest = CampaignManifest.read(fork)
    assert manifest.parent is not None
    assert (manifest.parent.url, manifest.parent.step, manifest.parent.version) == (parent.url, 2, 1)
    assert manifest.parent.config_diff == {"rollout.eta": {"parent": 10_000, "fork": 0}}
    assert load_campaign_config(fork).rollout.eta == 0
    status = campaign_status(fork)
    assert status["parent"] == {"url": parent.url, "step": 2, "version": 1}
    assert status["warm_start"] and status["published_versions"] == [0, 1] and "warm_start" not in status["todo"]
    # A rerun of the same fork does nothing.
    assert not fork_campaign(parent, 2, fork, {"rollout.eta": 0})["created"]

    write_groups(fork, range(4, 8), version=1)  # the groups the parent trained on at steps 3 and 4
    done = train(fork, load_campaign_config(fork), log=lambda _: None)
    assert (done["steps"], done["version"], done["groups_consumed"]) == (4, 2, 4)
    assert consumption_steps(fork) == [3, 4]
    for step in (3, 4):
        ours, theirs = ConsumptionLog.read(fork, step), ConsumptionLog.read(parent, step)
        assert [g.group_id.split("@")[0] for g in ours.groups] == [g.group_id.split("@")[0] for g in theirs.groups]
        assert ours.staleness_max == 0
        assert ours.metrics == theirs.metrics  # same state, same rows: the same floats
    assert final_params(fork) == final_params(parent)
    assert DoneMarker.read(fork).steps == 4

    kept = audit(fork)
    assert kept["ok"] and kept["violations"] == 0
    report = json.loads(fork.read(kept["report"]))
    assert report["report"]["campaign"]["parent"]["url"] == parent.url
    assert "forked from " + parent.url + " at step 2" in fork.read(kept["text"]).decode()
    # Lineage walks back from the fork's starting version into the parent's shards, read-only.
    (ancestor,) = report["report"]["ancestry"]
    assert (ancestor["url"], ancestor["step"], ancestor["version"]) == (parent.url, 2, 1)
    by_version = {p["version"]: p for p in ancestor["published"]}
    assert sorted(by_version) == [0, 1]
    steps_1_2 = [ConsumptionLog.read(parent, s) for s in (1, 2)]
    assert by_version[1]["steps"] == [1, 2] and by_version[1]["groups"] == 4
    assert by_version[1]["shards"] == sorted({g.shard for log in steps_1_2 for g in log.groups})

    view = build_view(fork)
    assert view.parent is not None and (view.parent["url"], view.parent["step"]) == (parent.url, 2)
    assert json.dumps(parent.url) in render_html(view)  # the page's data; its title line names the fork point

    # A fork of the fork walks back through both.
    grandchild = Store(str(tmp_path / "fork2"))
    fork_campaign(fork, 4, grandchild, {"trainer.optim.lr": 0.001})
    kept = audit(grandchild)
    assert kept["ok"]
    chain = json.loads(grandchild.read(kept["report"]))["report"]["ancestry"]
    assert [(a["url"], a["step"], a["version"]) for a in chain] == [(fork.url, 4, 2), (parent.url, 2, 1)]
    assert checksums(parent) == before


def test_a_fork_refuses_the_model_and_the_tokenizer_naming_the_key(parent: Store, tmp_path) -> None:
    for key in ("model.n_layers", "tokenizer"):
        with pytest.raises(ValueError, match=rf"--set {key}: a fork keeps its parent's"):
            fork_campaign(parent, 2, Store(str(tmp_path / "f")), {key: 2})
    assert not (tmp_path / "f").exists()


def test_a_fork_between_checkpoints_retrains_the_logged_steps_and_continues_exactly(parent: Store, tmp_path) -> None:
    before = checksums(parent)
    fork = Store(str(tmp_path / "fork"))
    fork_campaign(parent, 3, fork, {"rollout.eta": 0})  # checkpoint 2, then step 3 re-trained from its log
    assert CampaignManifest.read(fork).parent.version == 1  # step 3 published nothing: still version 1
    write_groups(fork, range(6, 8), version=1)  # the groups of the parent's step 4
    assert train(fork, load_campaign_config(fork), log=lambda _: None)["steps"] == 4
    assert consumption_steps(fork) == [4]
    assert ConsumptionLog.read(fork, 4).metrics == ConsumptionLog.read(parent, 4).metrics
    assert final_params(fork) == final_params(parent)
    assert checksums(parent) == before


def test_a_fork_interrupted_before_its_markers_completes_on_a_rerun(parent: Store, tmp_path) -> None:
    fork = Store(str(tmp_path / "fork"))
    fork_campaign(parent, 4, fork, {})
    # A crash after the copies, before the checkpoint's meta, its commit marker and campaign.json.
    for rel in ("campaign.json", "train/checkpoints/00000004/COMMITTED", "train/checkpoints/00000004/meta.json"):
        fork.delete(rel)
    assert fork_campaign(parent, 4, fork, {})["created"]
    trainer = trainer_for(fork, load_campaign_config(fork), log=lambda _: None)
    trainer.restore()
    assert (trainer.step, trainer.version) == (4, 2)
    assert final_params(parent) == final_params_of(trainer)


def final_params_of(trainer) -> str:
    import jax
    import numpy as np
    from flax import nnx

    return json.dumps([np.asarray(x).tolist() for x in jax.tree.leaves(nnx.state(trainer.model, nnx.Param))])


def test_a_fork_from_before_any_checkpoint_names_the_steps_with_one(parent: Store, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"step 1 has no committed checkpoint at or before it to fork from "
                                         r"\(steps with one: 2, 4\)"):
        fork_campaign(parent, 1, Store(str(tmp_path / "f")), {})


def test_fork_command_creates_the_fork_and_refuses_a_model_change(parent: Store, tmp_path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    url = str(tmp_path / "f")
    assert main(["fork", parent.url, "--from-step", "4", url, "--set", "trainer.optim.lr=0.001"]) == 0
    assert f"forked {parent.url} at step 4" in capsys.readouterr().out
    manifest = CampaignManifest.read(Store(url))
    assert manifest.parent is not None and manifest.parent.config_diff["trainer.optim.lr"]["fork"] == 0.001
    assert main(["fork", parent.url, "--from-step", "4", str(tmp_path / "g"), "--set", "model.d_model=8"]) == 2
    assert "--set model.d_model: a fork keeps its parent's model" in capsys.readouterr().err


def test_a_fork_on_the_gcs_emulator_restores_the_parents_checkpoint(parent: Store, gcs_store: Store,
                                                                     gcs_emulator: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Orbax reads through tensorstore, which ignores STORAGE_EMULATOR_HOST (used by etils' gcsfs backend).
    for name, value in (("STORAGE_EMULATOR_HOST", gcs_emulator), ("TENSORSTORE_GCS_HTTP_URL", gcs_emulator),
                        ("GOOGLE_AUTH_TOKEN_FOR_TESTING", "anon")):
        monkeypatch.setenv(name, value)
    for rel in parent.walk():
        gcs_store.create(rel, parent.read(rel))
    before = checksums(gcs_store)
    fork = gcs_store.other(gcs_store.url.rsplit("/", 1)[0] + "/fork")
    fork_campaign(gcs_store, 4, fork, {"rollout.eta": 1})
    trainer = trainer_for(fork, load_campaign_config(fork), log=lambda _: None)
    trainer.restore()
    assert (trainer.step, trainer.version, trainer.tailer.cursor.groups_consumed) == (4, 2, 0)
    assert trainer.eta == 1
    assert checksums(gcs_store) == before


@pytest.mark.slow
def test_a_fork_of_a_smoke_campaign_runs_the_campaign_flow_to_completion(prefect_api: str, tmp_path) -> None:
    """The real stages on both sides (about two minutes): the fork's campaign flow skips prep and the warm start
    (copied), collects on the checkpoint's version and trains steps 3 and 4. The default tests pin the same
    contract with synthetic shards (``test_a_fork_with_another_eta_resumes_...``)."""
    import yaml

    from flows.campaign import campaign
    from pipelines_lib.config import CampaignConfig

    smoke = tmp_path / "smoke.yaml"
    smoke.write_text(yaml.safe_dump(CampaignConfig.smoke().to_dict()))
    parent = Store(str(tmp_path / "parent"))
    campaign(parent.url, config_path=str(smoke), poll_s=0.5)
    before = checksums(parent)
    fork = Store(str(tmp_path / "fork"))
    fork_campaign(parent, 2, fork, {"rollout.eta": 0})
    forked = tmp_path / "fork.yaml"
    forked.write_text(yaml.safe_dump(CampaignManifest.read(fork).config))
    result = campaign(fork.url, config_path=str(forked), poll_s=0.5)
    assert result["init"]["created"] is False
    assert result["train"]["steps"] == 4 and result["train"]["version"] == 2
    assert consumption_steps(fork) == [3, 4]
    assert all(g.staleness == 0 for s in (3, 4) for g in ConsumptionLog.read(fork, s).groups)
    assert result["audit"]["ok"] and result["audit"]["violations"] == 0
    assert checksums(parent) == before
