"""SIGKILL drills on real subprocesses (drills/kills.py): the trainer resumes exactly (also when killed while it
publishes), a rollout worker loses and duplicates nothing, a killed evaluator leaves no partial result and
recovers the same figures. The default suite runs one kill of each (20-35 s each); the slow ones run more."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from drills.kills import (
    check_publication,
    evaluator_kill_drill,
    publish_in_flight,
    rollout_kill_drill,
    trainer_kill_drill,
)
from drills.supervisor import KillDrill, partial_visible
from pipelines_lib.storage.store import Store


@pytest.mark.parametrize("kills", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_killed_trainer_ends_bit_identical_with_no_group_trained_twice(tmp_path: Path, kills: int) -> None:
    result = trainer_kill_drill(tmp_path, kills=kills, seed=3)
    assert result.kills == kills and result.starts == kills + 1
    assert result.bit_identical
    assert result.trained_twice == 0 and result.groups_trained == 2 * result.steps
    assert result.partial_visible == 0
    assert result.unloadable == 0 and result.leftovers_at_end == 0 and len(result.landed) == kills
    assert len(result.resume_gaps_s) == kills and all(0 < g < 300 for g in result.resume_gaps_s)


@pytest.mark.parametrize("kills", [1, pytest.param(5, marks=pytest.mark.slow)])
def test_trainer_killed_while_publishing_leaves_latest_loadable_and_resumes_bit_identical(tmp_path: Path,
                                                                                          kills: int) -> None:
    result = trainer_kill_drill(tmp_path, kills=kills, seed=3, at_publish=True)
    assert result.kills == kills and result.starts == kills + 1
    # Each kill left a publication unfinished (normally mid Orbax save), and readers still saw only whole versions.
    assert len(result.landed) == kills and "outside" not in result.landed
    assert result.unloadable == 0 and result.leftovers_at_end == 0 and result.partial_visible == 0
    assert result.bit_identical
    assert result.trained_twice == 0 and result.groups_trained == 2 * result.steps


# About 70 s even at one kill: `make drills` and `make test-all` run it; the default suite kills the trainer and a
# rollout worker.
@pytest.mark.slow
@pytest.mark.parametrize("kills", [1, 5])
def test_killed_evaluator_leaves_no_partial_result_and_recovers_the_same_figures(tmp_path: Path, kills: int) -> None:
    result = evaluator_kill_drill(tmp_path, kills=kills, seed=7)
    assert result.kills == kills and result.starts == kills + 1
    assert set(result.eval_file_after_kill) <= {"absent", "complete"} and len(result.eval_file_after_kill) == kills
    assert result.partial_visible == 0
    assert result.results_identical and result.greedy_identical
    assert len(result.resume_gaps_s) == kills and result.recover_s is not None and result.recover_s > 0


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


def test_an_armed_kill_waits_for_the_probe_and_inspect_sees_what_the_kill_left(tmp_path: Path) -> None:
    # Ticks every 50 ms; after tick 10 the stand-in stage creates a flag file (the "state visible in storage").
    # The first start would tick for 20 s (room for a loaded machine), the restart ends after 12 ticks.
    flag = tmp_path / "flag"
    script = ("import sys, time, pathlib\nfor i in range(int(sys.argv[2])):\n    print('tick', i, flush=True)\n"
              "    if i == 10:\n        pathlib.Path(sys.argv[1]).touch()\n    time.sleep(0.05)\n")
    drill = KillDrill(argv=lambda: [sys.executable, "-c", script, str(flag), "400" if drill.starts == 0 else "12"],
                      ready=re.compile(r"^tick"),
                      done=lambda: drill.completed, kills=1, max_delay_s=0.0, arm=flag.exists,
                      inspect=lambda: {"flag": flag.exists()})
    records = drill.run()
    assert len(records) == 1 and drill.starts == 2
    assert records[0].found == {"flag": True}
    # The killed start's ticks are those before the restart's "tick 0" (by order, not by the time the drill read
    # them: under load a line can be read after the kill that followed it).
    ticks = [line for _, line in drill.lines if line.startswith("tick")]
    killed_start = ticks[:ticks.index("tick 0", 1)]
    assert 11 <= len(killed_start) < 400  # not at the first tick (unarmed), not after the stage ended


def test_publication_check_sets_unmarked_leftovers_apart_and_flags_a_marked_version_that_does_not_load(
        tmp_path: Path) -> None:
    from flax import nnx

    from harness.fixtures import small_trainer_config
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.records import Publication
    from pipelines_lib.storage.layout import weights_dir

    store = Store(str(tmp_path / "c"))
    publish_weights(store, Decoder(small_trainer_config(2).model, rngs=nnx.Rngs(0)), version=0, step=0)
    loaded: set[int] = set()
    assert not publish_in_flight(store)
    assert check_publication(store, loaded) == {"latest": 0, "mirror": 0, "marked": 1, "unmarked": [],
                                                "unloadable": [], "landed": "outside"}
    # A publish killed mid-save: an unmarked folder. Readers never load it, so it is a leftover, not a failure.
    store.create(f"{weights_dir(1)}/model_config.json", b'{"d_mo')
    assert publish_in_flight(store)
    found = check_publication(store, loaded)
    assert (found["unmarked"], found["unloadable"], found["landed"]) == ([1], [], "save")
    # The same folder with a marker is visible, and it does not load: that is what the drill must never see.
    Publication(version=1, path=weights_dir(1), step=2, published_at="x").write(store)
    found = check_publication(store, loaded)
    assert (found["unmarked"], found["landed"], found["latest"]) == ([], "pointer", 0)
    assert len(found["unloadable"]) == 1 and found["unloadable"][0].startswith("v1: ")
    assert loaded == {0}


def test_partial_visible_counts_unreadable_visible_objects_but_not_hidden_temporaries(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c"))
    store.create("trajectories/v00000000/w.1-00000000.arrow", b"not arrow")
    store.create("train/consumed/00000001.json", b'{"ok": true}')
    store.create("train/consumed/00000002.json", b'{"trunc')
    (tmp_path / "c" / "trajectories" / "v00000000" / ".w.1-00000001.arrow.tmp-abc").write_bytes(b"half")
    bad, orphans, paths = partial_visible(store)
    assert (bad, orphans) == (2, 1)
    assert any("00000002.json" in p for p in paths)
