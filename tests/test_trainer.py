"""The streaming trainer on real parts: a real tiny decoder, Orbax checkpoints, shards in a local campaign.

The SIGKILL test is the exact-resume contract: kill the trainer process at random moments, restart it, and
the final parameters are bit-identical to an uninterrupted run on the same pre-written shards, with every
group trained exactly once.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from harness.fixtures import consumed_group_ids, final_params, seed_trainer_campaign, small_trainer_config
from pipelines_lib.config import CampaignConfig
from pipelines_lib.mesh import MeshConfig, make_mesh
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.publish import load_published, publish_weights
from pipelines_lib.records import CheckpointMeta, DoneMarker, Publication, committed_checkpoints
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.stages.train import train, trainer_for
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.train.checkpoint import checkpoint_state, restore_latest, save_checkpoint
from pipelines_lib.train.optim import make_nnx_optimizer
from pipelines_lib.train.step import Precision
from pipelines_lib.train.trainer import DataTimeoutError, StreamingTrainer
from pipelines_lib.train.writer import host_snapshot
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.codec import read_shard
from pipelines_lib.trajectory.memory import MemoryChannel
from pipelines_lib.trajectory.record import Trajectory
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.writer import ShardWriter

ROOT = Path(__file__).resolve().parents[1]
ONE_DEVICE = make_mesh(MeshConfig())
"""Where optimizers are placed in tests that are not about meshes."""


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


def seed_group(config: CampaignConfig, i: int, version: int = 0, prompt_id: str | None = None) -> list[Trajectory]:
    """Worker ``w<version>``'s group ``i`` (seed ``i``; prompt ``p<i>`` unless given) at ``version``."""
    return synthetic_group(prompt_id=prompt_id or f"p{i:03d}", group_size=4, worker_id=f"w{version}",
                           policy_version=version, seed=i, vocab_size=config.model.vocab_size, max_len=60)


def unrewarded(group: list[Trajectory]) -> list[Trajectory]:
    """``group`` with every reward 0: all-equal rewards, so zero advantage."""
    return [dataclasses.replace(t, reward=0.0, reward_parts={"correct": 0.0}) for t in group]


def seed_campaign(url: str, config: CampaignConfig, n_groups: int = 14, versions: tuple[int, ...] = (0,), *,
                  per_shard: int = 3, rewarded: bool = True) -> Store:
    """A campaign with v0 published and ``n_groups`` groups per version in ``versions`` (prompt ``v<V>p<i>``),
    ``per_shard`` to a shard; ``rewarded=False``: every group ``unrewarded``."""
    store = Store(url)
    init_campaign(store, config)
    publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)),
                    version=0, step=0)
    for v in versions:
        writer = ShardWriter(store, worker_id=f"w{v}", config=WriterConfig(max_groups=per_shard))
        for i in range(n_groups):
            group = seed_group(config, i, v, None if versions == (0,) else f"v{v}p{i}")
            writer.add_group(group if rewarded else unrewarded(group))
        writer.flush()
    return store


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
    # every checkpoint_every (3) steps, publications (2, 4, 6) write none of their own
    assert committed_checkpoints(store) == [layout.checkpoint_dir(s) for s in (3, 6)]
    assert train(store, config) == DoneMarker.read(store).to_dict()  # a rerun is a no-op
    assert any("step 6/6" in line for line in logs)


@pytest.mark.parametrize(("compute", "kept"), [("bfloat16", True), ("float32", False)])
def test_a_version_is_written_from_the_cast_the_in_process_engine_keeps_else_from_host_copies(
        tmp_path, monkeypatch, compute: str, kept: bool) -> None:
    # bfloat16 compute on float32 masters: the cast handed to the engine is nobody's to donate, so the job writes those
    # very arrays. Served in float32, the engine is handed the masters, which the next step donates: the job writes
    # copies on the host's device.
    config = small_config(max_steps=2, checkpoint_every=5)
    config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, step=dataclasses.replace(
        config.trainer.step, precision=Precision(params="float32", compute=compute))))
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 8)
    handed: dict[int, list] = {}
    written: dict[int, list] = {}

    def capturing_publish(store: Store, model: Decoder, *, version: int, **kw: object) -> dict:
        written[version] = jax.tree.leaves(nnx.state(model, nnx.Param))
        return publish_weights(store, model, version=version, **kw)

    monkeypatch.setattr("pipelines_lib.train.writer.publish_weights", capturing_publish)
    trainer = trainer_for(store, config, log=lambda _: None,
                          on_publish=lambda v, m: handed.__setitem__(v, jax.tree.leaves(nnx.state(m, nnx.Param))))
    assert trainer.run()["steps"] == 2 and set(written) == set(handed) == {1}
    assert {str(leaf.dtype) for leaf in written[1]} == {compute}
    assert [a is b for a, b in zip(written[1], handed[1], strict=True)] == [kept] * len(written[1])


def test_the_trainer_trains_on_while_a_version_is_written(tmp_path, monkeypatch) -> None:
    # Version 1's write (after step 2) is held until the trainer has logged step 3 (a step that writes nothing):
    # a trainer that wrote its publications itself would wait here until the held write failed on its timeout.
    config = small_config(checkpoint_every=5)
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 14)
    step_3_logged = threading.Event()
    written: list[int] = []

    def held_publish(store: Store, model: Decoder, *, version: int, **kw: object) -> dict:
        if version == 1 and not step_3_logged.wait(timeout=60):
            raise TimeoutError("the trainer did not train step 3 while version 1 was being written")
        written.append(version)
        return publish_weights(store, model, version=version, **kw)

    monkeypatch.setattr("pipelines_lib.train.writer.publish_weights", held_publish)

    def log(line: str) -> None:
        if line.startswith("trainer: step 3/"):
            step_3_logged.set()

    summary = train(store, config, log=log)
    assert summary["steps"] == 6 and written == [1, 2, 3]
    from pipelines_lib.telemetry.trace import read_records

    # The writes ran one at a time, in step order, each recorded on the trainer's telemetry
    writes = [r["tags"]["what"] for r in read_records(store) if r["type"] == "span" and r["name"] == "write"]
    assert writes == ["step 2: version 1", "step 4: version 2", "step 5: checkpoint", "step 6: version 3 and checkpoint"]
    assert Publication.latest(store).version == 3  # the done marker came after every write
    assert committed_checkpoints(store) == [layout.checkpoint_dir(s) for s in (5, 6)]


def test_a_failed_background_write_stops_the_trainer_naming_it_and_leaves_no_done_marker(tmp_path, monkeypatch) -> None:
    config = small_config()
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 14)

    def failing_publish(store: Store, model: Decoder, *, version: int, **kw: object) -> dict:
        if version == 2:
            raise OSError("disk full")
        return publish_weights(store, model, version=version, **kw)

    monkeypatch.setattr("pipelines_lib.train.writer.publish_weights", failing_publish)
    with pytest.raises(RuntimeError, match=r"background write \(step 4: version 2\) failed: disk full"):
        train(store, config, log=lambda _: None)
    assert not DoneMarker.exists(store)
    assert Publication.latest(store).version == 1
    assert committed_checkpoints(store) == [layout.checkpoint_dir(3)]


def test_each_step_logs_the_behaviour_proximal_mismatch_in_its_consumption_log_and_telemetry(tmp_path) -> None:
    # Synthetic groups carry made-up sampler logprobs, so the mismatch to the trainer's is large and non-zero.
    config = small_config(max_steps=2)
    store = seed_campaign(str(tmp_path / "c"), config)
    train(store, config, log=lambda _: None)
    metrics = store.read_json(layout.consumed_log(1))["metrics"]
    assert metrics["prox_behav_logp_abs_diff_p99"] >= metrics["prox_behav_logp_abs_diff"] > 0
    assert metrics["behav_prox_kl"] > 0
    assert {f"correction_frac_{n}" for n in ("tis", "mis", "icepop", "geo_mask", "none")} <= set(metrics)
    from pipelines_lib.telemetry.trace import read_records

    gauges = {(r["name"], r["tags"]["step"]): r["value"] for r in read_records(store)
              if r["type"] == "gauge" and r["name"].startswith("train.")}
    assert gauges[("train.behav_prox_kl", 1)] == pytest.approx(metrics["behav_prox_kl"])
    assert gauges[("train.correction_frac_icepop", 1)] == pytest.approx(metrics["correction_frac_icepop"])


def test_a_trainer_asked_to_stop_between_steps_checkpoints_its_last_step_and_a_rerun_replays_nothing(tmp_path) -> None:
    config = small_config(max_steps=10, checkpoint_every=5, publish_every=5)
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 8)
    trainer = trainer_for(store, config, should_stop=lambda: trainer.step >= 2, log=lambda s: None)
    summary = trainer.run()
    assert summary["stopped"] and summary["steps"] == 2 and not DoneMarker.exists(store)
    assert committed_checkpoints(store) == [layout.checkpoint_dir(2)]  # not a checkpoint step: the stop's own
    logs: list[str] = []
    again = trainer_for(store, config, log=logs.append)
    again.restore()
    assert again.step == 2 and not [line for line in logs if "replayed" in line]
    assert again.run(max_steps=4)["steps"] == 4  # groups 5..8, read again from the cursor of step 2
    assert len(consumed_group_ids(store)) == 8 == len(set(consumed_group_ids(store)))


def test_mixed_precision_trainer_keeps_float32_masters_and_publishes_bfloat16(tmp_path) -> None:
    base = small_config(max_steps=2)
    step = dataclasses.replace(base.trainer.step, precision=Precision(params="float32", compute="bfloat16"))
    config = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, step=step))
    store = seed_campaign(str(tmp_path / "c"), config)
    trainer = trainer_for(store, config, log=lambda s: None)
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
    store = seed_trainer_campaign(str(tmp_path / "c"), config, 1)
    trainer = trainer_for(store, config, log=lambda s: None)
    with pytest.raises(DataTimeoutError, match=r"v00000000\.\.v00000000; have 1 of 2") as raised:
        trainer.run()
    assert trainer.idle_s > 0
    # What it did before it stalled comes with the error (nothing trained; the wait is the whole wall clock) and no
    # done marker is written: the trainer did not finish.
    progress = raised.value.progress
    assert progress is not None and (progress.steps, progress.version, progress.tokens_trained) == (0, 0, 0)
    assert progress.idle_s == pytest.approx(trainer.idle_s, abs=1e-3) and progress.wall_s >= progress.idle_s > 0.2
    assert not DoneMarker.exists(store)


def test_steps_on_all_equal_reward_groups_say_once_why_their_loss_is_zero(tmp_path) -> None:
    config = small_config(max_steps=3)
    store = seed_campaign(str(tmp_path / "c"), config, 6, rewarded=False)
    logs: list[str] = []
    trainer = trainer_for(store, config, log=logs.append)
    trainer.run()
    said = [line for line in logs if "all-equal rewards" in line]
    assert said == ["trainer: all 2 groups of step 1 had all-equal rewards (mean 0.00): zero advantage, so the loss "
                    "and its gradient are 0: nothing to learn from until a group's samples differ in reward "
                    "(said once)"]
    assert [m["loss"] for m in trainer.metrics] == [0.0, 0.0, 0.0]


def test_a_step_with_no_learning_signal_says_so_instead_of_a_zero_loss(tmp_path) -> None:
    config = small_config(max_steps=2)
    store = seed_campaign(str(tmp_path / "c"), config, 4, per_shard=2, rewarded=False)
    logs: list[str] = []
    trainer_for(store, config, log=logs.append).run()
    steps = [line.split(" staleness")[0] for line in logs if line.startswith("trainer: step ")]
    assert steps == [f"trainer: step {n}/2 v{v} no learning signal (reward 0.000, equal within every group)"
                     for n, v in ((1, 0), (2, 1))]


def test_groups_with_a_learning_signal_say_nothing_about_zero_advantage(tmp_path) -> None:
    config = small_config(max_steps=2)
    logs: list[str] = []
    trainer_for(seed_campaign(str(tmp_path / "c"), config), config, log=logs.append).run()
    assert not [line for line in logs if "all-equal rewards" in line]
    assert [line.split(" reward")[0].split(" loss ")[0] for line in logs if line.startswith("trainer: step ")] == [
        "trainer: step 1/2 v0", "trainer: step 2/2 v1"]
    assert all(" loss " in line for line in logs if line.startswith("trainer: step "))


def test_a_stream_of_all_equal_reward_groups_does_not_keep_the_trainer_waiting(tmp_path) -> None:
    """A collapsed policy's workers commit group after group with all-equal rewards: the trainer must time out on
    the wait for a trainable group while they still arrive, not wait for the stream to end."""
    config = small_config(skip_zero_advantage=True, data_timeout_s=1.0)
    store = seed_campaign(str(tmp_path / "c"), config, n_groups=0)
    cap = 400
    written, stop = [], threading.Event()

    def collapsed_worker() -> None:
        writer = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=1))
        for i in range(cap):
            if stop.is_set():
                return
            writer.add_group(unrewarded(seed_group(config, i)))
            writer.flush()
            written.append(i)
            stop.wait(0.02)

    thread = threading.Thread(target=collapsed_worker)
    thread.start()
    logs: list[str] = []
    try:
        with pytest.raises(DataTimeoutError, match=r"have 0 of 2; \d+ groups read meanwhile had all-equal rewards "
                                                   r"\(mean 0\.00\), no learning signal"):
            trainer_for(store, config, log=logs.append).run()
        assert len(written) < cap  # it gave up while the stream was still running
    finally:
        stop.set()
        thread.join(60)
    assert not store.list("train/consumed")


_TRAIN_SCRIPT = """
import sys
from pipelines_lib.stages.campaign import load_campaign_config
from pipelines_lib.storage.store import Store
from pipelines_lib.records import committed_checkpoints
from pipelines_lib.train.checkpoint import restore_latest, save_checkpoint
from pipelines_lib.train.optim import make_nnx_optimizer
from pipelines_lib.stages.train import train
store = Store(sys.argv[1])
train(store, load_campaign_config(store), log=lambda s: print(s, flush=True))
"""


def _restart_path(store: Store) -> tuple[str | None, int]:
    """What a restart must do now: the checkpoint it restores (None: none) and how many logged steps it replays."""
    folders = committed_checkpoints(store)
    k = int(folders[-1].rsplit("/", 1)[-1].split(".")[0]) if folders else 0
    logged = len(store.list("train/consumed"))
    return (folders[-1] if folders else None), logged - k


@pytest.mark.parametrize("n_kills", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_sigkilled_trainer_resumes_bit_identically(tmp_path, n_kills: int) -> None:
    config = small_config()
    reference = seed_trainer_campaign(str(tmp_path / "ref"), config, 14)
    train(reference, config, log=lambda s: None)
    expected = final_params(reference)

    store = seed_campaign(str(tmp_path / "killed"), config)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    kills, expected_path = 0, None
    while not store.exists(layout.TRAIN_DONE):
        proc = subprocess.Popen([sys.executable, "-c", _TRAIN_SCRIPT, store.url], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        head = []
        if kills < n_kills:
            # The first life is killed as it logs step 5 (checkpoint 3 committed, checkpoint 4 committed or still
            # being written off the loop, step 5 only in its log), later ones at their first step: each kill lands
            # mid-run, on a live process.
            for line in proc.stdout:
                head.append(line)
                if line.startswith("trainer: step 5/" if kills == 0 else "trainer: step"):
                    break
            assert proc.poll() is None, "".join(head)
            proc.kill()
            kills += 1
        out = "".join(head) + proc.communicate(timeout=300)[0]
        if expected_path is not None:  # this life restarted after a kill: it took the path storage dictated
            folder, replayed = expected_path
            restored = re.findall(r"trainer: restored checkpoint (\S+) \(step", out)
            assert restored == ([folder] if folder else []), out
            assert (f"replayed {replayed} logged step(s)" in out) == (replayed > 0), out
        if kills and proc.returncode == -signal.SIGKILL:
            expected_path = _restart_path(store)
        elif proc.returncode != 0:
            pytest.fail(f"trainer failed with {proc.returncode}:\n{out}")
        if kills == 1 and n_kills == 1:  # the first restart restores a checkpoint and replays logged steps after it
            assert expected_path is not None and expected_path[0] in {"train/checkpoints/00000003",
                                                                      "train/checkpoints/00000004"}, expected_path
            assert expected_path[1] >= 1, expected_path
    assert kills == n_kills
    groups = consumed_group_ids(store)
    assert len(groups) == len(set(groups)) == 12, "a group was trained twice or skipped"
    assert final_params(store) == expected


def test_the_trainer_trains_and_resumes_over_the_in_memory_channel_as_over_the_folder(tmp_path) -> None:
    config = small_trainer_config(6, checkpoint_every=2)  # checkpoints at steps 2, 4, 6: step 3 is log-only
    reference = seed_trainer_campaign(str(tmp_path / "folder"), config, 14)
    train(reference, config, log=lambda s: None)
    channel = MemoryChannel()
    store = seed_trainer_campaign(str(tmp_path / "memory"), config, 14, channel=channel)

    def trainer() -> StreamingTrainer:
        return StreamingTrainer(store, config.trainer, eta=config.rollout.eta, group_size=config.rollout.group_size,
                                log=lambda s: None, channel=channel)

    assert trainer().run(max_steps=3)["steps"] == 3
    resumed = trainer()
    resumed.restore()  # checkpoint 2, then step 3 replayed from the groups its log names, read from the channel
    assert resumed.step == 3
    assert resumed.run()["steps"] == 6
    assert store.list(layout.TRAJECTORIES) == []  # the groups never touched the folder
    assert consumed_group_ids(store) == consumed_group_ids(reference)
    assert final_params(store) == final_params(reference)


def test_a_new_trainer_restores_the_checkpoint_replays_the_logged_step_and_ends_bit_identical(tmp_path) -> None:
    config = small_config(checkpoint_every=2)  # checkpoints at steps 2, 4, 6: step 3 is log-only
    reference = seed_campaign(str(tmp_path / "ref"), config)
    train(reference, config, log=lambda s: None)
    store = seed_campaign(str(tmp_path / "resumed"), config)
    assert train(store, config, max_steps=3, log=lambda s: None)["steps"] == 3
    assert not store.exists(layout.TRAIN_DONE) and committed_checkpoints(store) == ["train/checkpoints/00000002"]
    logs: list[str] = []
    assert train(store, config, log=logs.append)["steps"] == 6
    assert logs[0] == "trainer: mesh data=1 × fsdp=1 × tensor=1 (1 device)"
    assert logs[1] == "trainer: restored checkpoint train/checkpoints/00000002 (step 2, version 1)"
    assert logs[2] == "trainer: replayed 1 logged step(s) after the checkpoint; now at step 3"
    assert [line.split()[2] for line in logs[3:] if line.startswith("trainer: step")] == ["4/6", "5/6", "6/6"]
    assert consumed_group_ids(store) == consumed_group_ids(reference)
    assert final_params(store) == final_params(reference)


def test_a_resume_replays_a_published_step_past_its_checkpoint_keeping_the_stored_version(tmp_path) -> None:
    # Checkpoint at 3, version 2 published at step 4 with no checkpoint of its own: a resume from step 5 re-trains
    # step 4 from its log, leaves version 2 as stored (the same weights) and ends bit-identical.
    config = small_config(checkpoint_every=3)
    reference = seed_campaign(str(tmp_path / "ref"), config)
    train(reference, config, log=lambda s: None)
    store = seed_campaign(str(tmp_path / "resumed"), config)
    assert train(store, config, max_steps=5, log=lambda s: None)["steps"] == 5
    assert committed_checkpoints(store) == ["train/checkpoints/00000003"] and Publication.latest(store).version == 2
    stored_v2 = store.read_json(layout.published_marker(2))
    logs: list[str] = []
    assert train(store, config, log=logs.append)["steps"] == 6
    assert logs[2] == "trainer: replayed 2 logged step(s) after the checkpoint; now at step 5"
    assert store.read_json(layout.published_marker(2)) == stored_v2  # not written again
    assert final_params(store) == final_params(reference)
    v2, ref_v2 = load_published(store, 2)[0], load_published(reference, 2)[0]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(nnx.state(v2, nnx.Param)),
                                                    jax.tree.leaves(nnx.state(ref_v2, nnx.Param)), strict=True))


@pytest.mark.parametrize(("eta", "trained", "dropped"), [
    # η = 0: only the current version trains; what the trainer's version has passed is dropped, logged in the step
    # that passed it. Each step publishes, so the window moves by one version per step.
    (0, [["v0p0@w0", "v0p1@w0"], ["v1p0@w1", "v1p1@w1"], ["v2p0@w2", "v2p1@w2"]],
     [[], ["v0p2@w0", "v0p3@w0"], ["v1p2@w1", "v1p3@w1"]]),
    # η = 1: one version behind still trains, so v0's last groups train at step 2 with staleness 1; nothing drops.
    (1, [["v0p0@w0", "v0p1@w0"], ["v0p2@w0", "v0p3@w0"], ["v1p0@w1", "v1p1@w1"]], [[], [], []]),
])
def test_trainer_trains_only_groups_inside_the_staleness_window_and_logs_the_dropped(
        tmp_path, eta: int, trained: list[list[str]], dropped: list[list[str]]) -> None:
    config = small_config(max_steps=3, publish_every=1, checkpoint_every=5)
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, eta=eta))
    store = seed_campaign(str(tmp_path / "c"), config, n_groups=4, versions=(0, 1, 2))
    summary = train(store, config, log=lambda s: None)
    logs = [store.read_json(f"train/consumed/{n}") for n in store.list("train/consumed")]
    assert [[g["group_id"] for g in log["groups"]] for log in logs] == trained
    # A shard the window passed before it was opened is logged with its group count, not its ids: read them here.
    assert [[gid for e in log["dropped_stale"] for gid in e["groups"] or dict.fromkeys(
        read_shard(store, e["shard"])[0].column("group_id").to_pylist())] for log in logs] == dropped
    assert all(len(e["groups"]) or e["unread_groups"] for log in logs for e in log["dropped_stale"])
    assert all(g["staleness"] == log["trainer_version"] - g["version"] <= eta for log in logs for g in log["groups"])
    assert summary["groups_dropped_stale"] == sum(map(len, dropped))


def _perturbed(tree):
    return jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def test_checkpoints_restore_params_and_optimiser_state_and_skip_a_partly_written_folder(tmp_path) -> None:
    config = small_config()
    store = Store(str(tmp_path / "c"))
    model = Decoder(config.model, rngs=nnx.Rngs(0))
    optimizer = make_nnx_optimizer(model, config.trainer.optim, ONE_DEVICE)
    assert restore_latest(store, model=model, optimizer=optimizer) is None
    nnx.update(optimizer, _perturbed(nnx.state(optimizer)))  # non-trivial optimiser state to restore
    saved = [np.asarray(x) for x in jax.tree.leaves((nnx.state(model, nnx.Param), nnx.state(optimizer)))]
    rng = jax.random.key(5)
    args = dict(version=1, cursor='{"c": 1}', rng=rng, state=checkpoint_state(model, optimizer))
    assert save_checkpoint(store, step=2, **args) == "train/checkpoints/00000002"
    assert save_checkpoint(store, step=2, **args) == "train/checkpoints/00000002"  # a committed step: no-op
    # A save of step 4 that died mid-write: a folder without COMMITTED. It is never restored, never written into.
    store.create("train/checkpoints/00000004/state/partial", b"half")
    assert committed_checkpoints(store) == ["train/checkpoints/00000002"]
    fresh_model = Decoder(config.model, rngs=nnx.Rngs(1))
    fresh_opt = make_nnx_optimizer(fresh_model, config.trainer.optim, ONE_DEVICE)
    folder, meta = restore_latest(store, model=fresh_model, optimizer=fresh_opt)
    assert (meta.step, meta.version, meta.cursor, folder) == (2, 1, '{"c": 1}', "train/checkpoints/00000002")
    assert meta.rng == [int(x) for x in jax.random.key_data(rng).ravel()]
    got = [np.asarray(x) for x in jax.tree.leaves((nnx.state(fresh_model, nnx.Param), nnx.state(fresh_opt)))]
    assert len(got) == len(saved) and all(np.array_equal(a, b) for a, b in zip(got, saved, strict=True))
    # The retried save of step 4 lands in a fresh attempt folder, and is then the one restored. It is saved from host
    # copies, as the trainer's background writes save it, and restores onto the device the same.
    host = {**args, "version": 2, "state": host_snapshot(checkpoint_state(model, optimizer))}
    assert save_checkpoint(store, step=4, **host) == "train/checkpoints/00000004.1"
    assert store.read("train/checkpoints/00000004/state/partial") == b"half"
    assert committed_checkpoints(store) == ["train/checkpoints/00000002", "train/checkpoints/00000004.1"]
    third_model = Decoder(config.model, rngs=nnx.Rngs(2))
    third_opt = make_nnx_optimizer(third_model, config.trainer.optim, ONE_DEVICE)
    assert restore_latest(store, model=third_model, optimizer=third_opt)[1].version == 2
    got = jax.tree.leaves((nnx.state(third_model, nnx.Param), nnx.state(third_opt)))
    assert all(isinstance(x, jax.Array) for x in got)
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(got, saved, strict=True))


def test_a_checkpoint_with_unrolled_layers_is_refused_naming_it(tmp_path) -> None:
    config = small_config()
    store = Store(str(tmp_path / "c"))
    model = Decoder(config.model, rngs=nnx.Rngs(0))
    optimizer = make_nnx_optimizer(model, config.trainer.optim, ONE_DEVICE)
    folder = layout.checkpoint_dir(3)
    # The item tree of a decoder whose layers were one subtree each (``layers/0/...``), committed as usual.
    unrolled = {"params": {"layers": {"0": {"attn_norm": {"scale": {"value": np.ones(4, np.float32)}}}}},
                "opt": {"step": {"value": np.zeros((), np.int32)}}}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "c" / folder / "state", unrolled)
    CheckpointMeta(step=3, version=1, cursor="{}", rng=[0, 0]).write(store, folder)
    store.create(layout.checkpoint_committed(folder), b"")
    with pytest.raises(ValueError, match=r"00000003/state: a trainer checkpoint with the decoder's layers unrolled"):
        restore_latest(store, model=model, optimizer=optimizer)
