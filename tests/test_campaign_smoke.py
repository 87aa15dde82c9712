"""Whole campaigns on the ``smoke`` preset with the real stages, on a local folder and on the GCS emulator.

Two promises of the README, end to end: ``flows.campaign`` takes an empty folder to an evaluated, audited policy
(every stage's marker and run record in the folder), and ``flows.recover`` finishes a campaign whose process was
SIGKILLed while its trainer was between checkpoints: the trainer restores the last checkpoint, replays the
logged step after it, and no step is trained twice. On ``gs://`` the same runs put the trainer's Orbax
checkpoints (optimiser state included) and published weights through tensorstore, and collect and evaluate
read them back from the bucket.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from prefect import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from flows.campaign import campaign
from pipelines_lib.config import CampaignConfig
from pipelines_lib.hints import storage_option_args
from pipelines_lib.records import AuditRecord, RunRecord, committed_checkpoints
from pipelines_lib.settings import Settings
from pipelines_lib.stages.campaign import campaign_status
from pipelines_lib.storage import layout
from pipelines_lib.storage.layout import published_marker
from pipelines_lib.storage.store import Store
from tests.conftest import gcs_options

ROOT = Path(__file__).resolve().parents[1]
STAGE_KEYS = ("init", "prep", "warm_start", "collect-w0", "collect-w1", "train", "evaluate-v00000000",
              "evaluate-v00000001", "evaluate-v00000002", "audit")


@pytest.fixture
def smoke_yaml(tmp_path: Path) -> str:
    """The smoke preset as a campaign YAML file (the way a user passes a config)."""
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(CampaignConfig.preset("smoke").to_dict()))
    return str(path)


@pytest.fixture(params=["local", "gcs"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict | None]:
    """(campaign URL, storage options) on each backend."""
    if request.param == "local":
        return str(tmp_path / "smoke_campaign"), None
    emulator, bucket = request.getfixturevalue("gcs_emulator"), request.getfixturevalue("gcs_bucket")
    return f"gs://{bucket}/campaigns/smoke_campaign", gcs_options(emulator)


def assert_finished(store: Store, checkpoints: tuple[str, ...] = ("00000002", "00000004")) -> None:
    """Every stage's marker is in the folder and the campaign has nothing left to do but (re)audit; the checkpoint
    folders are ``checkpoints`` (a save cut short keeps its folder, and the retry writes an attempt folder beside it)."""
    assert store.exists(layout.CAMPAIGN_JSON) and store.exists(layout.DATASET_SUCCESS)
    assert all(store.exists(published_marker(v)) for v in (0, 1, 2))
    assert store.read_pointer(layout.WEIGHTS_LATEST)["version"] == 2
    assert store.read_json(layout.TRAIN_DONE)["steps"] == 4
    assert store.list("train/checkpoints") == list(checkpoints)
    assert store.list("train/consumed") == [f"{s:08d}.json" for s in (1, 2, 3, 4)]
    assert all(store.exists(layout.eval_path(v)) for v in (0, 1, 2))
    status = campaign_status(store)
    assert status["todo"] == [] and status["shards"] > 0 and status["missing_eval"] == []
    # Orbax writes around the Store (through tensorstore): its items, the checkpoints' optimiser state included,
    # must be in the campaign's own storage, not wherever a mistranslated URL would put them.
    for version in (0, 1, 2):
        assert {"embed", "layers", "final_norm"} <= _orbax_tree_roots(store, f"{layout.weights_dir(version)}/state")
    assert [layout.checkpoint_step(folder) for folder in committed_checkpoints(store)] == [2, 4]
    for folder in committed_checkpoints(store):
        assert _orbax_tree_roots(store, f"{folder}/state") == {"params", "opt"}


def _orbax_tree_roots(store: Store, item: str) -> set[str]:
    """Top-level keys of the Orbax item ``item`` of the campaign, from the tree metadata Orbax commits with it."""
    keys = store.read_json(f"{item}/_METADATA")["tree_metadata"].values()
    return {k["key_metadata"][0]["key"] for k in keys}


# On the GCS emulator the recover test below runs the same campaign flow (up to its kill) and finishes it with the
# recover flow, through the same stages, markers and Orbax-through-tensorstore checks: this run is `make test-all`'s.
@pytest.mark.parametrize("where", ["local", pytest.param("gcs", marks=pytest.mark.slow)], indirect=True)
def test_smoke_campaign_runs_every_stage_and_marks_each_one_done(prefect_api: str, smoke_yaml: str,
                                                                 where: tuple[str, dict | None]) -> None:
    url, options = where
    state = campaign(url, config_path=smoke_yaml, storage_options=options, poll_s=0.5, return_state=True)
    result = state.result()
    store = Settings.from_env(os.environ).store(url, options)
    assert result["train"]["steps"] == 4 and result["train"]["version"] == 2
    assert sorted(result["evaluate"]) == [0, 1, 2]
    assert all(c["stop_reason"] == "done marker" for c in result["collect"])
    assert result["audit"]["ok"] and result["audit"]["violations"] == 0 and result["audit"]["bad_files"] == 0
    run_id = str(state.state_details.flow_run_id)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert run.name == "smoke_campaign-campaign"  # the folder's own name
    # Each evaluation's result reaches the run's log through its task's logger, as every stage's lines do.
    APILogWorker.drain_all(timeout=30)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
    said = [log.message for log in logs if log.message.startswith("evaluate v")]
    assert sorted(m.split(":")[0] for m in said) == ["evaluate v0", "evaluate v1", "evaluate v2"], said
    assert {"campaign:smoke_campaign", "stage:campaign", "preset:tiny"} <= set(run.tags)
    for key in STAGE_KEYS:
        assert RunRecord.read(store, key, run_id).state == "completed", key
    assert_finished(store)
    # The report and the learning-curve PNG land in the campaign folder.
    folder = "view/" + result["view"].split("/view/", 1)[1].removesuffix("/report.html")
    assert store.read(f"{folder}/report.html").lower().startswith(b"<!doctype html")
    assert store.read(f"{folder}/learning_curve.png")[:8] == b"\x89PNG\r\n\x1a\n"
    # A second run of the finished campaign does no stage work: every stage finds its marker.
    again = campaign(url, config_path=smoke_yaml, storage_options=options, poll_s=0.5)
    assert again["init"]["created"] is False and again["evaluate"] == {} and again["train"]["steps"] == 4
    assert store.list("train/consumed") == [f"{s:08d}.json" for s in (1, 2, 3, 4)]


HANG_DEADLINE_S = 900
"""A subprocess still running after this long is hung, not slow (a smoke campaign takes a few minutes on 2
cores, more on a loaded machine): it is killed and the test fails saying where, instead of hanging the suite."""

_RECOVER = """
import json, sys
from flows.recover import recover
result = recover(sys.argv[1], storage_options=json.loads(sys.argv[2]), poll_s=0.5)
print("RECOVER RESULT " + json.dumps(result, default=str), flush=True)
"""


class Bounded:
    """A subprocess in its own session, killed with all its descendants once ``deadline_s`` has passed."""

    def __init__(self, args: list[str], *, env: dict[str, str], what: str, deadline_s: float = HANG_DEADLINE_S) -> None:
        self.what, self.deadline_s, self.hung = what, deadline_s, threading.Event()
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self._timer = threading.Timer(deadline_s, self._kill_hung)
        self._timer.daemon = True  # never keeps pytest alive
        self._timer.start()

    def _kill_hung(self) -> None:
        self.hung.set()
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self, head: str = "") -> str:
        """The whole output once the process has ended; fails the test if the deadline killed it."""
        output = head + self.proc.communicate()[0]
        self._timer.cancel()
        if self.hung.is_set():
            pytest.fail(f"{self.what} was still running after {self.deadline_s} s (hung); killed. "
                        f"Last output:\n{output[-3000:]}")
        return output


def test_recover_finishes_a_campaign_sigkilled_between_checkpoints(prefect_api: str, smoke_yaml: str,
                                                                   where: tuple[str, dict | None]) -> None:
    url, options = where
    args = [sys.executable, "-m", "flows.campaign", url, "--config", smoke_yaml, *storage_option_args(options)]
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONUNBUFFERED": "1"}
    campaign_run = Bounded(args, env=env, what="the campaign (before its kill)")
    head = []
    # Step 3 is logged after its consumption log is written; step 3 has no checkpoint (every 2 steps): the kill
    # lands between checkpoints. Step 2's version and checkpoint are committed then, or still being written off the
    # trainer's loop: the recovery must take the path storage dictates, whichever it is.
    for line in campaign_run.proc.stdout:
        head.append(line)
        if "trainer: step 3/4 " in line:
            break
    alive = campaign_run.proc.poll() is None
    campaign_run.kill()
    output = campaign_run.finish("".join(head))
    assert alive, f"the campaign ended before the kill:\n{output[-3000:]}"
    assert "committed trajectories/" not in output  # one line per shard only with -v
    assert campaign_run.proc.returncode == -9, output[-3000:]

    store = Settings.from_env(os.environ).store(url, options)
    before = campaign_status(store)
    assert (before["train_steps"], before["train_done"]) == (3, False)
    assert (before["published_versions"], before["latest_checkpoint"]) in [
        ([0, 1], "train/checkpoints/00000002"), ([0, 1], None), ([0], None)], before
    restart_step = 2 if before["latest_checkpoint"] else 0
    # A checkpoint the kill cut short keeps its folder; the recovery's save of step 2 then goes to an attempt folder.
    cut_short = not restart_step and "00000002" in store.list("train/checkpoints")
    logged = {n: store.read(f"train/consumed/{n}") for n in store.list("train/consumed")}

    recovery = Bounded([sys.executable, "-c", _RECOVER, url, json.dumps(options)], env=env, what="flows.recover")
    lines = recovery.finish().splitlines()
    assert recovery.proc.returncode == 0, "\n".join(lines[-60:])
    result = json.loads(next(s for s in lines if s.startswith("RECOVER RESULT ")).split(" ", 2)[2])
    assert result["plan"] == ["collect", "train", "evaluate", "audit"]
    # The killed run was still Running in Prefect: the recovery marked it Crashed and named itself there.
    assert [r["name"] for r in result["abandoned"]] == ["smoke_campaign-campaign"]
    # The recovery path that ran: checkpoint 2 restored (if it was committed), the logged steps after it replayed,
    # only step 4 trained anew.
    restored = [s for s in lines if "trainer: restored checkpoint" in s]
    assert bool(restored) == bool(restart_step), lines
    assert not restored or re.search(r"checkpoints/00000002 \(step 2, version 1\)", restored[0]), lines
    assert any(f"trainer: replayed {3 - restart_step} logged step(s) after the checkpoint; now at step 3" in s
               for s in lines), lines
    assert [s for s in lines if re.search(r"trainer: step \d/4 ", s)] == [
        s for s in lines if "trainer: step 4/4 " in s] != []
    assert {n: store.read(f"train/consumed/{n}") for n in sorted(logged)} == logged  # kept, not rewritten
    assert sorted(map(int, result["evaluate"])) == [v for v in (0, 1, 2) if v not in before["evaluated_versions"]]
    assert result["audit"]["ok"] and result["audit"]["violations"] == 0
    assert_finished(store, ("00000002", "00000002.1", "00000004") if cut_short else ("00000002", "00000004"))
    report = AuditRecord.at(store, result["audit"]["report"]).report
    accounting = report["lineage"]["accounting"]
    assert accounting["consumed"] == 4 * 2 and accounting["unusable"] == 0  # every trained group once
