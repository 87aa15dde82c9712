"""Two processes × 4 fake CPU devices train one campaign together (``jax.distributed``, gloo on 127.0.0.1).

Each process is ``rollstream train URL --process-id i`` with the campaign's ``distributed`` section; the
harness (``bench/scale.py``) seeds the campaign, launches them and compares with the streaming trainer on one
device over a copy of the same folder.
"""

from pathlib import Path

import pytest

from bench.scale import peer_loss_run, two_process_run

RTOL = 1e-5
"""As in ``tests/test_mesh.py``: summation order differs across devices (measured 3e-7 on the parameters)."""


def test_two_processes_train_like_one_device_and_only_process_0_writes(tmp_path: Path) -> None:
    result = two_process_run(tmp_path)
    assert result["losses"] == pytest.approx(result["reference_losses"], rel=RTOL)
    assert result["param_rel_diff"] <= RTOL
    # Process 0 alone writes: the folder holds exactly the records, markers and publications of the one-process
    # run (Orbax's per-process files aside), and one process's telemetry. A second writer of a marker would have
    # failed its create-only write.
    assert result["files_only_in_two"] == [] and result["files_only_in_one"] == []
    # One writer of telemetry: process 0's span log and its TensorBoard events, nothing from process 1.
    jsonl = [f for f in result["telemetry_files"] if f.endswith(".jsonl")]
    events = [f for f in result["telemetry_files"] if "/tb/" in f]
    assert len(jsonl) == 1 and len(events) <= 1 and len(jsonl) + len(events) == len(result["telemetry_files"])


@pytest.mark.slow
def test_a_killed_peer_fails_the_survivor_and_a_restart_resumes_bit_identically(tmp_path: Path) -> None:
    # Covered by default: the two-process run above (same launch, same collectives); this adds the failure path.
    uninterrupted = two_process_run(tmp_path)
    assert uninterrupted["param_rel_diff"] <= RTOL
    result = peer_loss_run(tmp_path, str(tmp_path / "two"))
    assert result["survivor_rc"] != 0
    assert result["names_peer"]  # "The following tasks are unhealthy (stopped sending heartbeats): 1"
    assert "restored checkpoint" in result["restart_log"] or "replayed" in result["restart_log"]
    assert result["resume_identical"]
