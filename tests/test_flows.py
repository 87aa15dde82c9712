"""Flows against a real (ephemeral, temporary-database) Prefect API, shared by the whole module.

These tests pin the pure pieces and the Prefect wiring (run records, artifacts, progress); whole campaigns and
recoveries with the real stages are in ``test_campaign_smoke``.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import subprocess
import sys
import time

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

from flows import artifacts
from flows.campaign import _wait_training, expand_campaign_url, summary
from flows.monitor import TrainProgress
from flows.recover import recovery_plan
from flows.stages import audit_flow, prep_flow
from harness.fixtures import consumption_log, eval_result
from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import RunRecord, StopRequest, versions_to_evaluate
from pipelines_lib.rollout.collect import stop_requested, utc_compact
from pipelines_lib.stages import report
from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store
from tasks.prep import prep_dataset


def _artifacts(key: str) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


# -- pure pieces ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("module", "explicit", "expected"), [("flows.campaign", None, 180),
                                                              ("flows.stages", "45", 45)])
def test_the_flows_environment_defaults_reach_prefects_settings(tmp_path, module: str, explicit: str | None,
                                                                expected: int) -> None:
    # Prefect reads its settings when first imported: a default set after that (in main) never reached them, and a
    # fresh Prefect home gave up on its ephemeral server after 20 s. A fresh process, as `python -m` starts one.
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect")}
    if explicit is not None:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = explicit  # an explicit setting wins
    code = (f"import {module}; from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as s; "
            "print(s.value())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.split() == [str(expected)]


def test_config_is_yaml_then_overrides_then_workers(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("workers: 3\ntrainer:\n  max_steps: 9\n  publish_every: 3\n")
    config = CampaignConfig.build(config_path=str(path), overrides={"trainer.max_steps": 4}, workers=1)
    assert (config.workers, config.trainer.max_steps, config.trainer.publish_every) == (1, 4, 3)
    assert CampaignConfig.build() == CampaignConfig.tiny()
    assert CampaignConfig.build(preset="smoke").trainer.max_steps == 4  # the smoke recipe, under no YAML


def test_scheduled_urls_get_the_scheduled_utc_date() -> None:
    when = dt.datetime(2026, 12, 2, 3, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert expand_campaign_url("gs://b/nightly-{date}", when) == "gs://b/nightly-20261202"
    assert expand_campaign_url("gs://b/{datetime}", when) == "gs://b/20261202T0130"
    assert expand_campaign_url("gs://b/fixed", when) == "gs://b/fixed"


def test_ends_evaluates_the_first_and_last_published_versions() -> None:
    assert versions_to_evaluate([0, 1, 2, 3], "ends") == [0, 3]
    assert versions_to_evaluate([0, 1, 2, 3], "all") == [0, 1, 2, 3]
    assert versions_to_evaluate([0], "ends") == [0]


def test_the_summary_of_a_campaign_that_solved_no_task_says_so_instead_of_zero_points(tmp_path) -> None:
    store = Store(str(tmp_path / "c"))
    for v in (0, 2):
        eval_result(v, greedy_success_rate=0.0, pass_at_k=0.0).write(store)
    held_out = [line for line in summary(store, 1.0, {"ok": True}).splitlines() if line.startswith("held-out")]
    assert held_out == ["held-out: no evaluated version (v0, v2) solved a task, so there is no learning to show; "
                        "a plumbing check such as --preset smoke cannot learn"]
    eval_result(3, greedy_success_rate=0.25, pass_at_k=0.5).write(store)
    assert "v0 0.0% -> v3 25.0% (+25.0 points)" in summary(store, 1.0, {"ok": True})


def test_recovery_runs_the_listed_stages_in_campaign_order() -> None:
    status = {"todo": ["collect", "train", "evaluate", "audit"]}
    assert recovery_plan(status) == ["collect", "train", "evaluate", "audit"]
    with pytest.raises(ValueError, match="no campaign.json"):
        recovery_plan({"todo": ["init", "prep", "audit"]})


def test_artifact_keys_and_eval_rows() -> None:
    assert artifacts.campaign_slug("gs://bucket/campaigns/Nightly_20261202/") == "nightly-20261202"
    rows = report.eval_rows({"version": 2, "accuracy": 0.5, "by_env": {"arith": {"n": 8}}, "ok": True})
    assert rows == [{"metric": "version", "value": 2.0}, {"metric": "accuracy", "value": 0.5},
                    {"metric": "by_env.arith.n", "value": 8.0}]


# -- Prefect wiring ---------------------------------------------------------------------------------------
def test_a_stage_flow_links_its_run_to_its_outputs(prefect_api, campaign: Store) -> None:
    state = prep_flow(campaign.url, return_state=True)
    manifest = state.result()
    record = RunRecord.read(campaign, "prep", str(state.state_details.flow_run_id))
    assert record.state == "completed" and record.manifest == manifest
    assert record.flow_run_name and record.task_run_id
    dataset = [p for p in campaign.walk() if p.startswith("dataset/")]
    again = prep_flow(campaign.url, return_state=True)
    assert again.result() == manifest
    assert [p for p in campaign.walk() if p.startswith("dataset/")] == dataset  # a no-op rerun
    assert len([p for p in campaign.walk() if p.startswith("runs/prep-")]) == 2  # ... that is still on record


def test_train_progress_follows_the_consumption_logs(prefect_api, campaign: Store) -> None:
    lines: list[str] = []

    @flow
    def watch() -> float:
        progress = TrainProgress(campaign, max_steps=4, log=lines.append, key="progress-test-train")
        assert progress.poll() == 0
        for step in (1, 2, 3):
            consumption_log(step, staleness=(step % 2,), mean_reward=0.25 * step,
                            published_version=1 if step == 2 else None).write(campaign)
        assert progress.poll() == 3
        return progress.percent

    assert watch() == 75.0
    assert lines == ["progress: step 3/4 (75%), batch reward 0.750, staleness <= 1"]
    (artifact,) = _artifacts("progress-test-train")
    assert artifact.type == "progress" and float(artifact.data) == 75.0


class FlakyExists(Store):
    """The campaign folder as the monitor sees it in a storage outage: its first ``failures`` existence checks fail
    (as they do once the store's own retries run out); writes and the other reads work."""

    def __init__(self, url: str, *, failures: int) -> None:
        super().__init__(url)
        self.failures = failures

    def exists(self, rel: str) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise StorageError("exists", self.uri(rel), "TimeoutError: stalled (gave up after 6 tries in 120.0s)")
        return super().exists(rel)


def _consumed(store: Store, step: int) -> None:
    consumption_log(step, mean_reward=0.5).write(store)


def test_a_failed_progress_poll_is_logged_and_read_again_at_the_next_poll(prefect_api, campaign: Store) -> None:
    lines: list[str] = []
    warnings: list[str] = []
    store = FlakyExists(campaign.url, failures=2)

    @flow
    def watch() -> list[int]:
        progress = TrainProgress(store, max_steps=4, log=lines.append, warn=warnings.append, max_failed_polls=3,
                                 key="progress-flaky-train")
        _consumed(campaign, 1)
        _consumed(campaign, 2)
        return [progress.poll(), progress.poll(), progress.poll(), progress.failed_polls]

    assert watch() == [0, 0, 2, 0]
    assert lines == ["progress: step 2/4 (50%), batch reward 0.500, staleness <= 0"]
    assert len(warnings) == 2 and warnings[1].startswith("progress: poll failed (2 in a row, giving up at 3), retrying")
    assert f"storage exists {campaign.url}/train/consumed/00000001.json" in warnings[0]


def test_a_progress_monitor_gives_up_after_failed_polls_in_a_row_naming_op_and_url(campaign: Store) -> None:
    progress = TrainProgress(FlakyExists(campaign.url, failures=3), max_steps=4, log=print, max_failed_polls=3)
    assert progress.poll() == progress.poll() == 0
    with pytest.raises(StorageError, match=rf"^storage exists {campaign.url}/train/consumed/00000001.json: ") as err:
        progress.poll()
    assert err.value.__notes__ == ["progress monitor: 3 polls in a row failed; giving up"]


@task
def _slow_trainer(seconds: float, error: str | None = None) -> dict[str, int]:
    time.sleep(seconds)
    if error:
        raise RuntimeError(error)
    return {"steps": 0}


@task
def _failing_trainer() -> dict[str, int]:
    raise RuntimeError("trainer crashed")


@task
def _rollout_worker(url: str, since: str) -> str:
    store = Store(url)
    deadline = time.monotonic() + 30
    while not stop_requested(store, since=since):
        if time.monotonic() > deadline:
            return "never asked to stop"
        time.sleep(0.02)
    return "stopped"


@pytest.mark.parametrize("trainer_error", [None, "trainer failed in the same outage"])
def test_a_campaign_whose_monitor_gives_up_stops_its_stages_and_waits_for_them(prefect_api, campaign: Store,
                                                                              trainer_error: str | None) -> None:
    @flow
    def run() -> tuple[str, str]:
        worker = _rollout_worker.submit(campaign.url, utc_compact())
        trainer = _slow_trainer.submit(1.0, trainer_error)
        progress = TrainProgress(FlakyExists(campaign.url, failures=100), max_steps=4, log=print, max_failed_polls=3)
        # The monitor gives up after 3 polls (~0.1 s) while the trainer still runs; a trainer's own error wins.
        expected = (RuntimeError, trainer_error) if trainer_error else (
            StorageError, r"^storage exists .*/train/consumed/00000001.json: ")
        with pytest.raises(expected[0], match=expected[1]):
            _wait_training(trainer, [worker], progress, poll_s=0.02, recover="rollstream recover")
        # Only once both had ended: no stage thread outlives the run.
        assert trainer.state.is_final() and worker.state.is_final()
        requested_at = StopRequest.times(campaign)[0]
        return worker.result(), StopRequest.read(campaign, requested_at).reason

    worker, reason = run()
    assert worker == "stopped"
    assert reason.startswith("progress monitor failed: storage exists ")


def test_a_failed_trainer_stops_the_rollout_workers_before_its_error_surfaces(prefect_api, campaign: Store) -> None:
    @flow
    def run() -> str:
        worker = _rollout_worker.submit(campaign.url, utc_compact())
        progress = TrainProgress(campaign, max_steps=4, log=print)
        with pytest.raises(RuntimeError, match="trainer crashed"):
            _wait_training(_failing_trainer.submit(), [worker], progress, poll_s=0.02,
                           recover="rollstream recover")
        assert worker.state.is_final()
        return worker.result()

    assert run() == "stopped"


def test_audit_flow_publishes_its_summary(prefect_api, campaign: Store) -> None:
    prep_flow(campaign.url)
    summary = audit_flow(campaign.url)
    assert summary["ok"]
    (artifact,) = _artifacts("audit-my-campaign")
    assert artifact.type == "markdown" and "# Audit: OK" in artifact.data and "verdict: OK" in artifact.data


def test_telemetry_rows_pick_the_headlines_and_every_status_and_staleness_count() -> None:
    summary = {"gauge.rollout.engine_busy_fraction": {"last": 0.5, "mean": 0.91234, "max": 1.0},
               "span.rollout.weight_swap": {"count": 3, "total_s": 1.5, "mean_s": 0.5, "p95_s": 0.7},
               "count.rollout.status.ok": {"total": 40.0}, "count.rollout.status.tool_error": {"total": 2.0},
               "count.trainer.staleness.1": {"total": 7.0}, "gauge.rollout.unlisted": {"last": 1, "mean": 1, "max": 1}}
    assert report.telemetry_rows(summary) == [
        {"signal": "engine busy fraction (mean)", "value": 0.9123},
        {"signal": "weight swaps", "value": 3.0},
        {"signal": "weight swap pause s (total)", "value": 1.5},
        {"signal": "rollout status ok", "value": 40.0},
        {"signal": "rollout status tool_error", "value": 2.0},
        {"signal": "trainer staleness 1", "value": 7.0},
    ]


def test_telemetry_artifact_is_built_from_the_folders_records(prefect_api, campaign: Store) -> None:
    with telemetry.recording(campaign, "trainer", sample_every_s=None):
        for _ in range(2):
            with telemetry.span("train_step"):
                pass
        telemetry.count("staleness.0", 5)

    @flow
    def publish() -> list:
        return artifacts.publish_telemetry(campaign.url, campaign)

    assert publish() == [{"signal": "train steps", "value": 2.0}, {"signal": "trainer staleness 0", "value": 5.0}]
    (artifact,) = _artifacts("telemetry-my-campaign")
    assert artifact.type == "table" and "train steps" in artifact.data


def test_learning_curve_artifact_embeds_the_png(prefect_api, campaign: Store) -> None:
    for step in (1, 2):
        consumption_log(step, mean_reward=0.5).write(campaign)

    @flow
    def curve() -> str:
        return artifacts.publish_learning_curve(campaign.url, campaign, steps=4)

    markdown = curve()
    data = markdown.split("(data:image/png;base64,", 1)[1].split(")", 1)[0]
    assert base64.b64decode(data)[:4] == b"\x89PNG"
    assert _artifacts("curve-my-campaign")[0].data == markdown


class FlakyDataset(Store):
    """Writes under ``dataset/`` fail ``failures`` times the way a storage outage surfaces once the store's own
    retries ran out (a StorageError caused by a timeout), then work; ``error`` replaces that with a permanent one."""

    failures = 0
    error: type[Exception] | None = None

    def create(self, rel: str, data: bytes) -> None:
        if rel.startswith("dataset/") and (FlakyDataset.failures > 0 or FlakyDataset.error):
            if FlakyDataset.error:
                raise FlakyDataset.error(f"{rel}: refused")
            FlakyDataset.failures -= 1
            raise StorageError("create", self.uri(rel), "gave up after 6 tries") from TimeoutError("stalled")
        super().create(rel, data)


def _task_states(flow_run_id) -> list[str]:
    with get_client(sync_client=True) as client:
        (run,) = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        return [s.name for s in sorted(client.read_task_run_states(run.id), key=lambda s: s.timestamp)]


@pytest.mark.parametrize(("failures", "error", "states", "failed_records"), [
    (2, None, ["Pending", "Running", "Retrying", "Retrying", "Completed"], 2),  # no delay: straight to Retrying
    (0, ValueError, ["Pending", "Running", "Failed"], 1),
])
def test_a_stage_task_retries_transient_storage_errors_only(prefect_api, campaign: Store, monkeypatch,
                                                          failures: int, error: type | None, states: list[str],
                                                          failed_records: int) -> None:
    import pipelines_lib.settings

    monkeypatch.setattr(FlakyDataset, "failures", failures)
    monkeypatch.setattr(FlakyDataset, "error", error)
    monkeypatch.setattr(pipelines_lib.settings, "Store", FlakyDataset)  # what Settings.store builds for every stage task

    @flow
    def stage() -> dict:
        return prep_dataset.with_options(retry_delay_seconds=0)(campaign.url)  # retries and condition as shipped

    state = stage(return_state=True)
    assert _task_states(state.state_details.flow_run_id) == states
    failed = [n for n in campaign.list("runs") if n.startswith("prep-") and "-failed-" in n]
    assert len(failed) == failed_records
    if error is None:
        assert state.is_completed() and campaign.exists(layout.DATASET_SUCCESS)
    else:
        assert state.is_failed() and not campaign.exists(layout.DATASET_SUCCESS)
