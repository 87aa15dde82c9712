"""SIGTERM and SIGINT stop a run politely: every stage at its next safe point, the process out within 30 s with
128+signal, the campaign's status and the command that continues it printed, and that command finishes it.

Real processes throughout: ``rollstream run`` on the smoke preset (real flow, real Prefect API, real stages), a
``rollstream stage train`` deployment flow on a seeded campaign, and the stop handler itself in a bare interpreter
for the second signal and the watchdog.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows.recover import recover
from harness.fixtures import seed_trainer_campaign, small_trainer_config
from pipelines_lib.records import AuditRecord
from pipelines_lib.stages.campaign import campaign_status
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from tests.test_campaign_smoke import ROOT, Bounded, smoke_yaml  # noqa: F401 (smoke_yaml: a fixture)

EXIT_WITHIN_S = 30.0


def _signal_after(run: Bounded, line: str, signum: int) -> tuple[str, float]:
    """Wait for ``line`` in the output, then send ``signum`` to the process group (as Ctrl-C or ``timeout`` do);
    returns the whole output and the seconds from the signal to the exit."""
    head = []
    for text in run.proc.stdout:
        head.append(text)
        if line in text:
            break
    assert run.proc.poll() is None, "".join(head)[-3000:]
    os.killpg(run.proc.pid, signum)
    sent = time.monotonic()
    output = run.finish("".join(head))
    return output, time.monotonic() - sent


def _no_hidden_temporaries(store: Store) -> list[str]:
    return [f"trajectories/{v}/{n}" for v in store.list("trajectories")
            for n in store.list(f"trajectories/{v}", include_hidden=True) if n.startswith(".")]


# SIGINT takes the same path after its handler (which the second-signal test below runs cheaply): `make test-all`'s.
@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_run_stops_at_safe_points_on_a_signal_and_recover_finishes_the_campaign(
        prefect_api: str, smoke_yaml: str, tmp_path: Path, signum: int) -> None:  # noqa: F811
    url = str(tmp_path / "stopped")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONUNBUFFERED": "1"}
    run = Bounded([sys.executable, "-m", "pipelines_lib.cli", "run", url, "--config", smoke_yaml], env=env,
                  what="rollstream run")
    output, took = _signal_after(run, "trainer: step 1/4 ", signum)

    assert run.proc.returncode == 128 + signum, output[-3000:]
    assert took < EXIT_WITHIN_S, output[-3000:]
    assert "stopping every stage at its next safe point" in output
    assert "Traceback" not in output, output[-3000:]
    store = Store(url)
    # The status and the command that continues, as printed.
    assert f"to do: collect, train, evaluate, audit; run them with: {sys.executable} -m pipelines_lib.cli recover " \
           f"{store.url}" in output, output[-3000:]
    status = campaign_status(store)
    assert not status["train_done"] and status["train_steps"] in (1, 2, 3)
    # The trainer checkpointed the step it stopped at (a resume replays nothing); the workers committed their
    # open shards and started nothing after the stop request.
    assert status["latest_checkpoint"] == f"train/checkpoints/{status['train_steps']:08d}", status
    assert "trainer: stopped at step" in output
    assert _no_hidden_temporaries(store) == []
    assert store.list(layout.ROLLOUT_STOPS), "no stop request in the folder"

    result = recover(url, poll_s=0.5)
    assert result["plan"] == ["collect", "train", "evaluate", "audit"]
    assert result["audit"]["ok"] and result["audit"]["violations"] == 0, result["audit"]
    assert store.read_json(layout.TRAIN_DONE)["steps"] == 4
    assert store.list("train/consumed") == [f"{s:08d}.json" for s in (1, 2, 3, 4)]
    accounting = AuditRecord.at(store, result["audit"]["report"]).report["lineage"]["accounting"]
    assert accounting["consumed"] == 4 * 2 and accounting["unusable"] == 0  # every trained group once


def test_a_stage_run_stops_at_its_next_safe_point_and_ends_cancelled(prefect_api: str, tmp_path: Path) -> None:
    """``rollstream stage train`` (the train deployment's flow): the trainer, waiting for the groups of its 4th step,
    checkpoints its 3 steps and the run ends Cancelled; the process exits 143."""
    config = small_trainer_config(10, checkpoint_every=5, publish_every=5, data_timeout_s=300)
    store = seed_trainer_campaign(str(tmp_path / "staged"), config, 3 * 2)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONUNBUFFERED": "1"}
    run = Bounded([sys.executable, "-m", "pipelines_lib.cli", "stage", "train", store.url], env=env,
                  what="rollstream stage train")
    output, took = _signal_after(run, "trainer: step 3/10 ", signal.SIGTERM)

    assert run.proc.returncode == 128 + signal.SIGTERM and took < EXIT_WITHIN_S, output[-3000:]
    assert "ended Cancelled" not in output  # the stop is reported as a stop, not as a failed run
    assert f"run them with: {sys.executable} -m pipelines_lib.cli stage train {store.url}" in output, output[-3000:]
    status = campaign_status(store)
    assert (status["train_steps"], status["train_done"], status["latest_checkpoint"]) == (
        3, False, "train/checkpoints/00000003")


@pytest.mark.slow
def test_run_colocated_stops_at_safe_points_on_sigterm_and_the_printed_recover_finishes_the_campaign(
        tmp_path: Path) -> None:
    url = str(tmp_path / "colocated")
    args = [sys.executable, "-m", "pipelines_lib.cli", "run-colocated", url, "--preset", "smoke"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = Bounded(args, env=env, what="rollstream run-colocated")
    output, took = _signal_after(run, "trainer: step 1/4 ", signal.SIGTERM)

    assert run.proc.returncode == 128 + signal.SIGTERM and took < EXIT_WITHIN_S, output[-3000:]
    store = Store(url)
    assert f"run them with: {sys.executable} -m pipelines_lib.cli recover {store.url}" in output
    status = campaign_status(store)
    assert not status["train_done"] and status["latest_checkpoint"] == f"train/checkpoints/{status['train_steps']:08d}"
    assert _no_hidden_temporaries(store) == []

    again = Bounded([sys.executable, "-m", "pipelines_lib.cli", "recover", url], env=env,
                    what="the printed rollstream recover")
    output = again.finish()
    assert again.proc.returncode == 0 and '"audit_ok": true' in output, output[-3000:]
    assert store.read_json(layout.TRAIN_DONE)["steps"] == 4


_HANDLER = """
import sys, time
from pipelines_lib.stages.stopping import stop_on_signals
with stop_on_signals(report=lambda: "STATUS TABLE of c\x1b[2J", resume="rollstream recover X",
                     grace_s=float(sys.argv[1])):
    print("armed", flush=True)
    time.sleep(120)  # a stage with no safe point in sight
"""


def _handler(grace_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HANDLER), str(grace_s)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline() == "armed\n"
    return proc


def test_a_second_signal_during_the_grace_period_exits_at_once() -> None:
    proc = _handler(grace_s=60)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None  # the first one waits for the safe points
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=5)
    assert proc.returncode == 130, out
    assert "second SIGINT: exiting now; continue with: rollstream recover X" in out


def test_the_watchdog_exits_with_the_status_when_no_safe_point_comes_within_the_grace_period() -> None:
    proc = _handler(grace_s=1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 143, out
    assert "still running 1s after the signal" in out and "STATUS TABLE of c\\x1b[2J" in out and "\x1b" not in out


_STOPPED = """
import signal, sys
from pipelines_lib.hints import hint_command
from pipelines_lib.stages.stopping import check_stop, stoppable_command
from pipelines_lib.storage.store import Store
store = Store(sys.argv[1])
with stoppable_command(store, hint_command(["recover", store.url])) as stop:
    signal.raise_signal(signal.SIGTERM)
    check_stop()
sys.exit(stop.exit_code)
"""


def test_a_control_sequence_in_a_campaign_s_name_reaches_the_stop_message_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "c\x1b]0;owned\x07"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_STOPPED), str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr
    escaped = str(tmp_path / "c\\x1b]0;owned\\x07")
    assert f"stopped; file://{escaped}:" in proc.stderr and f"recover 'file://{escaped}'" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
