"""Secret-leak drill: planted fake credentials never reach campaign files, traces, reports or logs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drills.secrets import API_TOKEN, planted_secrets, run_secret_drill, scan


def test_no_planted_secret_reaches_any_output_of_the_stages(tmp_path: Path) -> None:
    report = run_secret_drill(tmp_path / "drill", real_rollouts=False)
    assert report.stages[-1] == "cli_audit(exit 0)"
    assert report.files_scanned > 15
    assert report.leaks == ()


@pytest.mark.slow
def test_no_planted_secret_leaks_with_real_rollouts(tmp_path: Path) -> None:
    report = run_secret_drill(tmp_path / "drill", real_rollouts=True, groups=2)
    assert "collect" in report.stages
    assert report.leaks == ()


def test_the_scan_finds_a_secret_in_plain_and_in_compressed_arrow_files(tmp_path: Path) -> None:
    import pyarrow as pa

    (tmp_path / "log.txt").write_text(f"token={API_TOKEN}\n")
    table = pa.table({"text": [f"x {API_TOKEN} y"] * 100})
    with pa.ipc.new_file(tmp_path / "rows.arrow", table.schema,
                         options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    (tmp_path / "clean.json").write_text("{}")
    n, leaks = scan(tmp_path, {"ROLLSTREAM_API_TOKEN": API_TOKEN})
    assert n == 3
    assert sorted(leak.file for leak in leaks) == ["log.txt", "rows.arrow"]


def test_planted_secrets_are_removed_afterwards(tmp_path: Path) -> None:
    before = os.environ.get("ROLLSTREAM_API_TOKEN")
    with planted_secrets(tmp_path) as secrets:
        assert os.environ["ROLLSTREAM_API_TOKEN"] == secrets["ROLLSTREAM_API_TOKEN"] == API_TOKEN
    assert os.environ.get("ROLLSTREAM_API_TOKEN") == before
