"""Forking a finished campaign: a new folder that references its parent's history and trains on from its state.

The parent is ``conftest.trained_campaign``: 12 steps over 24 synthetic version-0 groups, checkpoints and versions
1, 2, 3 at steps 4, 8 and 12, η = 10 000. A fork from step 10 (version 2) with η = 5 holds only its
``campaign.json``; its trainer restores the parent's checkpoint 8, replays steps 9 and 10 from the parent's logs,
then trains steps 11 and 12 on the four groups the parent had committed but not trained at step 10 (they are
in the parent's shards, beyond the cursor). Same state, same rows: the fork's steps 11 and 12 are the parent's
floats, and its version 3 equals the parent's. Its grandchild (η = 0, two more steps) trains on groups of its own.
"""

from __future__ import annotations

import json

import pytest

from harness.fixtures import final_params
from pipelines_lib.audit import audit_campaign
from pipelines_lib.audit.export import export_parquet
from pipelines_lib.audit.view import build_view, render_html
from pipelines_lib.cli import main
from pipelines_lib.hints import hint_command
from pipelines_lib.records import (
    CampaignManifest,
    ConsumptionLog,
    DoneMarker,
    ForkParent,
    consumption_steps,
    with_parents,
)
from pipelines_lib.stages.audit import audit
from pipelines_lib.stages.campaign import campaign_status, load_campaign_config
from pipelines_lib.stages.fork import fork_campaign
from pipelines_lib.stages.train import train, trainer_for
from pipelines_lib.storage.errors import AlreadyExistsError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.window import Window
from pipelines_lib.trajectory.writer import ShardWriter
from tests.conftest import TRAINED_STEPS, checksums


def write_groups(store: Store, seeds: range, *, version: int) -> None:
    """Synthetic groups ``seeds`` (as ``seed_trainer_campaign`` makes them) from a worker on ``version``."""
    vocab = load_campaign_config(store).model.vocab_size
    writer = ShardWriter(store, worker_id="w1", config=WriterConfig(max_groups=3))
    for i in seeds:
        writer.add_group(synthetic_group(prompt_id=f"p{i:03d}", group_size=4, worker_id="w1", policy_version=version,
                                         seed=i, vocab_size=vocab, max_len=60))
    writer.flush()


def published(report: dict) -> dict[int, dict]:
    return {p["version"]: p for p in report["lineage"]["published"]}


def test_a_fork_from_step_10_with_another_eta_runs_to_completion_on_its_parents_history_without_writing_there(
        trained_campaign: Store, tmp_path) -> None:
    parent = trained_campaign
    before = checksums(parent)
    fork = Store(str(tmp_path / "fork"))
    assert fork_campaign(parent, 10, fork, {"rollout.eta": 5})["created"]
    manifest = CampaignManifest.read(fork)
    assert manifest.parent is not None
    assert (manifest.parent.url, manifest.parent.step, manifest.parent.version) == (parent.url, 10, 2)
    assert manifest.parent.config_diff == {"rollout.eta": {"parent": 10_000, "fork": 5}}
    assert fork.walk() == ["campaign.json"]  # referenced, not copied
    status = campaign_status(fork)
    assert status["parent"] == {"url": parent.url, "step": 10, "version": 2}
    assert status["published_versions"] == [0, 1, 2] and status["train_steps"] == 10
    assert "warm_start" not in status["todo"]
    assert not fork_campaign(parent, 10, fork, {"rollout.eta": 5})["created"]  # a rerun does nothing

    done = train(fork, load_campaign_config(fork), log=lambda _: None)
    assert (done["steps"], done["version"], done["groups_consumed"]) == (TRAINED_STEPS, 3, 2 * TRAINED_STEPS)
    assert consumption_steps(fork) == [11, 12]  # its own folder: the parent's steps are read there
    assert consumption_steps(with_parents(fork)) == list(range(1, 13))
    for step in (11, 12):
        ours, theirs = ConsumptionLog.read(fork, step), ConsumptionLog.read(parent, step)
        assert [(g.shard, g.group_id) for g in ours.groups] == [(g.shard, g.group_id) for g in theirs.groups]
        assert ours.metrics == theirs.metrics  # the parent's state, replayed to step 10, and its rows: same floats
    assert final_params(fork) == final_params(parent)
    assert DoneMarker.read(fork).steps == TRAINED_STEPS
    assert not any(p.startswith(("trajectories/", "weights/v00000000", "weights/v00000001", "weights/v00000002",
                                 "dataset/", "train/consumed/0000000")) for p in fork.walk())

    kept = audit(fork)
    assert kept["ok"] and kept["violations"] == 0
    report = json.loads(fork.read(kept["report"]))["report"]
    assert "forked from " + parent.url + " at step 10" in fork.read(kept["text"]).decode()
    # Lineage from the fork's last version walks back through the parent's logs and shards.
    versions = published(report)
    parent_shards = {g.shard for s in range(1, 13) for g in ConsumptionLog.read(parent, s).groups}
    assert versions[3]["steps"] == [9, 10, 11, 12] and versions[3]["groups"] == 8
    assert set(versions[3]["shards"]) <= parent_shards and all(parent.exists(s) for s in versions[3]["shards"])
    assert versions[1]["steps"] == [1, 2, 3, 4]
    (ancestor,) = report["ancestry"]
    assert (ancestor["url"], ancestor["step"], ancestor["version"]) == (parent.url, 10, 2)
    assert [p["version"] for p in ancestor["published"]] == [0, 1, 2]

    view = build_view(fork)
    assert view.parent is not None and (view.parent["url"], view.parent["step"]) == (parent.url, 10)
    assert view.total_groups == 2 * TRAINED_STEPS  # the parent's groups, seen through the fork
    assert json.dumps(parent.url) in render_html(view)

    # A fork of the fork: η = 0 and two more steps, on groups of its own from a worker on version 3.
    fork_sums = checksums(fork)
    grandchild = Store(str(tmp_path / "fork2"))
    fork_campaign(fork, 12, grandchild, {"rollout.eta": 0, "trainer.max_steps": 14})
    write_groups(grandchild, range(100, 104), version=3)
    assert train(grandchild, load_campaign_config(grandchild), log=lambda _: None)["steps"] == 14
    kept = audit(grandchild)
    assert kept["ok"] and kept["violations"] == 0
    report = json.loads(grandchild.read(kept["report"]))["report"]
    assert [(a["url"], a["step"], a["version"]) for a in report["ancestry"]] == [(fork.url, 12, 3), (parent.url, 10, 2)]
    versions = published(report)
    assert sorted(versions) == [0, 1, 2, 3, 4] and versions[4]["steps"] == [13, 14]
    assert all(grandchild.exists(s) for s in versions[4]["shards"])  # its own shards, then its ancestors'
    assert set(versions[3]["shards"]) <= parent_shards
    assert checksums(fork) == fork_sums and checksums(parent) == before


def test_a_fork_reads_its_parent_only_up_to_the_fork_point_and_never_writes_there(
        trained_campaign: Store, tmp_path) -> None:
    fork = Store(str(tmp_path / "fork"))
    fork_campaign(trained_campaign, 6, fork, {"trainer.optim.lr": 0.001})
    view = with_parents(fork)
    assert consumption_steps(view) == [1, 2, 3, 4, 5, 6]
    assert [f.rsplit("/", 1)[-1] for f in view.list("train/checkpoints")] == ["00000004"]
    assert view.list("weights") == ["LATEST.json.d", "v00000000", "v00000001"]
    assert not view.exists("train/DONE.json") and not view.exists("weights/v00000002/PUBLISHED.json")
    assert view.uri("train/checkpoints/00000004/state") == trained_campaign.uri("train/checkpoints/00000004/state")
    name = Store(trained_campaign.url).walk("trajectories/v00000000")[0]
    assert view.read(name) == trained_campaign.read(name)
    view.create(name, trained_campaign.read(name))  # its own bytes again: a create-only no-op
    with pytest.raises(AlreadyExistsError, match="the parent campaign holds this object"):
        view.create(name, b"other bytes")
    assert Store(fork.url).walk() == ["campaign.json"]
    # Export sees the fork as its trainer does: the parent's versions up to the fork's, row for row.
    exported = {(e.version, e.rows, e.shards) for e in export_parquet(fork, Store(str(tmp_path / "fork_export")))}
    parents = {(e.version, e.rows, e.shards) for e in export_parquet(trained_campaign, Store(str(tmp_path / "export")))}
    assert exported == {e for e in parents if e[0] <= 1} and exported


def test_a_fork_ancestry_that_loops_is_an_error_naming_the_loop_and_an_audit_finding(tmp_path) -> None:
    a, b = Store(str(tmp_path / "a")), Store(str(tmp_path / "b"))
    for child, parent in ((a, b), (b, a)):
        CampaignManifest(schema_version="1", code_version="x", created_at="2026-01-01T00:00:00+00:00", config={},
                         parent=ForkParent(url=parent.url, step=1, version=0, config_diff={})).write(child)
    with pytest.raises(ValueError, match=rf"its fork ancestry loops: {a.url} -> {b.url} -> {a.url}"):
        with_parents(a)
    assert audit_campaign(a).violation_counts.get("fork_cycle") == 1


def test_a_fork_refuses_keys_the_parents_history_fixes_naming_the_key(trained_campaign: Store, tmp_path) -> None:
    for key in ("model.n_layers", "tokenizer", "dataset.n_train", "rollout.group_size", "trainer.seq_buckets"):
        with pytest.raises(ValueError, match=rf"--set {key}: a fork keeps its parent's"):
            fork_campaign(trained_campaign, 8, Store(str(tmp_path / "f")), {key: 2})
    assert not (tmp_path / "f").exists()


def test_a_fork_after_the_last_trained_step_names_the_last(trained_campaign: Store, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"a fork starts at a step the parent trained, and its last is step 12; "
                                         r"got step 14"):
        fork_campaign(trained_campaign, 14, Store(str(tmp_path / "f")), {})


def test_fork_command_creates_the_fork_and_refuses_a_model_change(trained_campaign: Store, tmp_path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    url = str(tmp_path / "f")
    assert main(["fork", trained_campaign.url, "--from-step", "8", url, "--set", "trainer.optim.lr=0.001"]) == 0
    out = capsys.readouterr().out
    assert f"forked {trained_campaign.url} at step 8" in out and f"run it with: {hint_command(['recover', Store(url).url])}" in out
    manifest = CampaignManifest.read(Store(url))
    assert manifest.parent is not None and manifest.parent.config_diff["trainer.optim.lr"]["fork"] == 0.001
    assert main(["fork", trained_campaign.url, "--from-step", "8", str(tmp_path / "g"), "--set",
                 "model.d_model=8"]) == 2
    assert "--set model.d_model: a fork keeps its parent's model" in capsys.readouterr().err


def test_a_fork_on_the_gcs_emulator_resumes_from_its_parents_checkpoint_there(
        trained_campaign: Store, gcs_store: Store, gcs_emulator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Orbax reads through tensorstore, which ignores STORAGE_EMULATOR_HOST (used by etils' gcsfs backend).
    for name, value in (("STORAGE_EMULATOR_HOST", gcs_emulator), ("TENSORSTORE_GCS_HTTP_URL", gcs_emulator),
                        ("GOOGLE_AUTH_TOKEN_FOR_TESTING", "anon")):
        monkeypatch.setenv(name, value)
    for rel in trained_campaign.walk():
        if not rel.startswith(("telemetry/", "audit/")):
            gcs_store.create(rel, trained_campaign.read(rel))
    before = checksums(gcs_store)
    fork = gcs_store.other(gcs_store.url.rsplit("/", 1)[0] + "/fork")
    fork_campaign(gcs_store, 10, fork, {"rollout.eta": 5})
    trainer = trainer_for(fork, load_campaign_config(fork), log=lambda _: None)
    trainer.restore()  # checkpoint 8 on the parent, then steps 9 and 10 from its logs
    assert (trainer.step, trainer.version, trainer.tailer.cursor.groups_consumed) == (10, 2, 20)
    got = trainer.tailer.next_groups(2, Window(version=2, eta=2))
    assert [g.group_id for g in got] == [g.group_id for g in ConsumptionLog.read(gcs_store, 11).groups]
    assert fork.walk() == ["campaign.json"]
    assert checksums(gcs_store) == before


def test_fork_flow_creates_the_fork(prefect_api: str, trained_campaign: Store, tmp_path) -> None:
    from flows.fork import fork_flow

    before = checksums(trained_campaign)
    result = fork_flow(trained_campaign.url, 8, str(tmp_path / "f"), {"rollout.eta": 2})
    assert result["created"] and result["parent"]["version"] == 2
    assert Store(str(tmp_path / "f")).walk() == ["campaign.json"]
    assert checksums(trained_campaign) == before


@pytest.mark.slow
def test_a_fork_of_a_smoke_campaign_runs_to_completion_through_the_fork_flow(prefect_api: str, tmp_path) -> None:
    """The real stages on both sides (about two minutes): the fork flow's recover run finds the dataset and the
    warm start through the parent, collects on the fork's version and trains steps 3 and 4. The default tests pin
    the same contract with synthetic shards (``test_a_fork_from_step_10_with_another_eta_...``)."""
    import yaml

    from flows.campaign import campaign
    from flows.fork import fork_flow
    from pipelines_lib.config import CampaignConfig

    smoke = tmp_path / "smoke.yaml"
    smoke.write_text(yaml.safe_dump(CampaignConfig.preset("smoke").to_dict()))
    parent = Store(str(tmp_path / "parent"))
    campaign(parent.url, config_path=str(smoke), poll_s=0.5)
    before = checksums(parent)
    fork = Store(str(tmp_path / "fork"))
    result = fork_flow(parent.url, 2, fork.url, {"rollout.eta": 0}, run=True, poll_s=0.5)
    assert result["run"]["plan"][:2] == ["collect", "train"]
    assert result["run"]["train"]["steps"] == 4 and result["run"]["train"]["version"] == 2
    assert consumption_steps(fork) == [3, 4]
    assert all(g.staleness == 0 for s in (3, 4) for g in ConsumptionLog.read(fork, s).groups)
    assert result["run"]["audit"]["ok"] and result["run"]["audit"]["violations"] == 0
    assert checksums(parent) == before
