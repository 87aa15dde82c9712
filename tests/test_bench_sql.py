"""The ``sql`` benchmark's measurement: a child process's own peak memory and the rows its query counted."""

from __future__ import annotations

from pathlib import Path

from bench.sql import run_query
from bench.storage_scale import build_campaign


def test_the_query_child_counts_every_trajectory_and_reports_its_own_peak_memory(tmp_path: Path) -> None:
    build_campaign(tmp_path / "campaign", 40)  # 2 shards of 4 trajectories in each of 20 versions
    seconds, rss_mb, trajectories = run_query(tmp_path / "campaign", tmp_path / "verdicts")
    assert trajectories == 160
    assert 0 < seconds < 60
    assert 50 < rss_mb < 2000  # an interpreter with pyarrow and DuckDB loaded, in MB (ru_maxrss is KiB)
