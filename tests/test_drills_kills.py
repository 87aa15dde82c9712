"""SIGKILL drills on real subprocesses (drills/kills.py): the trainer resumes exactly, a rollout worker loses and
duplicates nothing. The default suite runs one kill of each (about a minute together); the slow ones run more."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pipelines_lib.drills.kills import KillDrill, partial_visible, rollout_kill_drill, trainer_kill_drill
from pipelines_lib.storage.store import Store


@pytest.mark.parametrize("kills", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_killed_trainer_ends_bit_identical_with_no_group_trained_twice(tmp_path: Path, kills: int) -> None:
    result = trainer_kill_drill(tmp_path, kills=kills, seed=3)
    assert result.kills == kills and result.starts == kills + 1
    assert result.bit_identical
    assert result.trained_twice == 0 and result.groups_trained == 2 * result.steps
    assert result.partial_visible == 0
    assert len(result.resume_gaps_s) == kills and all(0 < g < 300 for g in result.resume_gaps_s)


@pytest.mark.parametrize("kills", [1, pytest.param(5, marks=pytest.mark.slow)])
def test_killed_rollout_worker_loses_and_duplicates_no_committed_group(tmp_path: Path, kills: int) -> None:
    result = rollout_kill_drill(tmp_path, kills=kills, seed=5)
    assert result.kills == kills and result.starts >= kills + 1
    assert result.acknowledged_groups > 0
    assert (result.lost, result.duplicated, result.partial_visible) == (0, 0, 0)
    assert result.groups_committed >= 8  # the last start's own target, plus what the killed starts committed
    assert len(result.resume_gaps_s) == kills


def test_kill_drill_measures_the_gap_to_the_next_progress_line(tmp_path: Path) -> None:
    # A stand-in stage: prints "tick" lines; a restart appends to a file so the drill knows when it is done.
    marker = tmp_path / "starts"
    script = ("import sys, time, pathlib\np = pathlib.Path(sys.argv[1])\np.write_text(p.read_text() + 'x' "
              "if p.exists() else 'x')\nfor i in range(30):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n")
    drill = KillDrill(argv=lambda: [sys.executable, "-c", script, str(marker)], ready=re.compile(r"^tick"),
                      done=lambda: drill.completed, kills=2, seed=0, max_delay_s=0.2)
    records = drill.run()
    assert len(records) == 2 and drill.starts == 3 and marker.read_text() == "xxx"
    assert all(r.gap_s is not None and 0 < r.gap_s < 30 for r in records)


def test_partial_visible_counts_unreadable_visible_objects_but_not_hidden_temporaries(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    store.create("trajectories/v00000000/w.1-00000000.arrow", b"not arrow")
    store.create("train/consumed/00000001.json", b'{"ok": true}')
    store.create("train/consumed/00000002.json", b'{"trunc')
    (tmp_path / "c" / "trajectories" / "v00000000" / ".w.1-00000001.arrow.tmp-abc").write_bytes(b"half")
    bad, orphans, paths = partial_visible(store)
    assert (bad, orphans) == (2, 1)
    assert any("00000002.json" in p for p in paths)
