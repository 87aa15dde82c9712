"""The operator's commands never write into the campaign they read, never replace a file unasked, and ``sql`` is
a query over the campaign's tables, not a shell: each attack of the drill (``drills/operator_writes.py``) refused
with one line while every file of the campaign stays as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drills.operator_writes import CASES, run_writes_drill, seed_campaign, snapshot
from pipelines_lib.cli import main
from pipelines_lib.stages.fork import missing_steps
from pipelines_lib.storage.destination import DestinationError, inside, refuse_inside, write_file


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_campaign(tmp_path_factory.mktemp("writes"))


@pytest.fixture
def campaign(pristine: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(pristine, tmp_path / "c")
    return tmp_path / "c"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", [n for n in CASES if n != "fork_beyond_the_last_step"])
def test_each_operator_write_into_the_campaign_is_refused_with_one_line_and_changes_nothing(
        name: str, campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where an extension install would land
    args, expect = CASES[name]
    before = snapshot(campaign)
    code, out, err = run([a.replace("{c}", str(campaign)).replace("{scratch}", str(tmp_path)) for a in args], capsys)
    assert code == 2 and expect in err and len(err.strip().splitlines()) == 1, err
    assert snapshot(campaign) == before
    assert "root:" not in out + err and not (tmp_path / "home").exists()


def test_sql_still_answers_over_the_campaigns_tables_after_locking_itself(campaign: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["sql", str(campaign), "SELECT count(*) AS n FROM trajectories", "--json"], capsys)
    assert code == 0 and '"n": 8' in out
    code, _, err = run(["sql", str(campaign), "SET enable_external_access = true"], capsys)
    assert code == 2 and "locked" in err


def test_trace_refuses_to_replace_a_file_unless_asked_and_then_replaces_it_whole(
        campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("the operator's notes")
    code, _, err = run(["trace", str(campaign), "--out", str(out)], capsys)
    assert code == 2 and "already exists; pass --overwrite" in err
    assert out.read_text() == "the operator's notes"
    assert run(["trace", str(campaign), "--out", str(out), "--overwrite"], capsys)[0] == 0
    assert '"traceEvents"' in out.read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_a_symlink_or_dotdot_into_the_campaign_is_inside_it_and_a_sibling_prefix_is_not(tmp_path: Path) -> None:
    c = tmp_path / "c"
    (c / "train").mkdir(parents=True)
    (tmp_path / "link").symlink_to(c / "train")
    assert inside(str(tmp_path / "link" / "x.json"), str(c))
    assert inside(f"file://{tmp_path}/other/../c/campaign.json", f"file://{c}")
    assert not inside(str(tmp_path / "c2" / "x"), str(c))
    assert inside("gcs://b/p/c/out", "gs://b/p/c") and not inside("gs://b/p/cc", "gs://b/p/c")
    with pytest.raises(DestinationError, match="--out .* is inside the campaign"):
        refuse_inside(str(tmp_path / "link"), [str(tmp_path / "x"), str(c)], what="--out")


def test_write_file_creates_once_and_replaces_only_on_request(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write_file(path, b"one")
    with pytest.raises(DestinationError, match="already exists; pass --overwrite"):
        write_file(path, b"two")
    write_file(path, b"three", overwrite=True)
    assert path.read_bytes() == b"three" and sorted(os.listdir(tmp_path)) == ["t.json"]


def test_a_fork_beyond_the_parents_last_step_is_refused_at_once_naming_the_last(
        campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["fork", str(campaign), "--from-step", str(10**30), str(tmp_path / "fork")], capsys)
    assert code == 2 and "its last is step 3; got step 1000000000000000000000000000000" in err
    assert not (tmp_path / "fork").exists()


def test_missing_steps_counts_the_gaps_without_walking_the_range() -> None:
    assert missing_steps([1, 2, 5], 0, 10) == ([3, 4, 6, 7, 8], 7)
    assert missing_steps([], 0, 10**30) == ([1, 2, 3, 4, 5], 10**30)
    assert missing_steps([3, 4], 2, 4) == ([], 0)
    assert missing_steps([2, 4, 6, 8, 10, 12], 0, 14, limit=3) == ([1, 3, 5], 8)


def test_the_writes_drill_records_no_overwrite_and_no_added_file(tmp_path: Path) -> None:
    report = run_writes_drill(tmp_path, lambda _: None, names=["sql_copy_over_campaign_json", "fork_into_campaign"])
    assert report.figures() == {"reliability.operator_write_cases": 2.0, "reliability.operator_overwrites": 0.0,
                                "reliability.operator_files_added": 0.0, "reliability.operator_write_failures": 0.0}
