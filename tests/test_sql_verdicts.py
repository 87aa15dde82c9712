"""Shard verdicts kept between SQL queries: a repeat query decodes only new shards, and nothing a campaign's
writer can do (rewrite a shard, even restoring its time; plant a verdict file) makes a damaged shard pass."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.storage_scale import build_campaign
from pipelines_lib.audit import verdicts as verdicts_module
from pipelines_lib.audit.sql import campaign_tables, shard_paths
from pipelines_lib.cli import main
from pipelines_lib.storage.store import Store


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files count as settled at once (the tests write shards and query them within the same second)."""
    monkeypatch.setattr(verdicts_module, "SETTLED_S", 0.0)


def query(store: Store, kept: Path) -> tuple[int, list[str], list[str]]:
    """(trajectories, progress lines, skipped shards) of a count over ``store`` keeping verdicts in ``kept``."""
    lines: list[str] = []
    tables = campaign_tables(store, progress=lines.append, verdicts=kept)
    n = tables.query("SELECT count(*) AS n FROM trajectories").to_pylist()[0]["n"]
    return n, lines, [s for s, _ in tables.skipped]


def test_a_repeat_query_decodes_only_the_shards_added_since(tmp_path: Path, settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    assert query(store, tmp_path / "kept")[:1] == (160,)
    n, lines, _ = query(store, tmp_path / "kept")
    assert n == 160 and "40 of 40 shards unchanged since judged valid; checking 0" in lines
    extra = tmp_path / "c" / shard_paths(store)[0].replace("-00000000-", "-00000099-")
    extra.write_bytes((tmp_path / "c" / shard_paths(store)[0]).read_bytes())  # a copy under a new name: new
    n, lines, _ = query(store, tmp_path / "kept")
    assert "40 of 41 shards unchanged since judged valid; checking 1" in lines


def test_a_shard_rewritten_after_its_verdict_is_checked_again_and_reported(tmp_path: Path, settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    query(store, tmp_path / "kept")
    victim = tmp_path / "c" / shard_paths(store)[5]
    st = os.stat(victim)
    victim.write_bytes(b"\0" * st.st_size)  # same size, and the old times put back: only ctime tells
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    n, lines, skipped = query(store, tmp_path / "kept")
    assert skipped == [shard_paths(store)[5]] and n == 156
    assert "39 of 40 shards unchanged since judged valid; checking 1" in lines


def test_a_verdict_file_others_may_write_or_another_checker_wrote_is_not_trusted(tmp_path: Path, settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    query(store, tmp_path / "kept")
    (kept,) = (tmp_path / "kept").glob("*.json")
    kept.chmod(0o666)
    assert not any("unchanged since judged valid" in line for line in query(store, tmp_path / "kept")[1])
    kept.write_text(json.dumps({**json.loads(kept.read_text()), "checker": "an older checker"}))
    assert not any("unchanged since judged valid" in line for line in query(store, tmp_path / "kept")[1])


def test_a_shard_changed_within_the_file_clocks_tick_gets_no_verdict(tmp_path: Path) -> None:
    store = build_campaign(tmp_path / "c", 40)  # just written: none settled yet
    query(store, tmp_path / "kept")
    assert not any("unchanged since judged valid" in line for line in query(store, tmp_path / "kept")[1])


def test_rollstream_sql_keeps_its_verdicts_in_the_users_cache(tmp_path: Path, settled: None,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = build_campaign(tmp_path / "c", 40)
    monkeypatch.setenv("ROLLSTREAM_CACHE", str(tmp_path / "cache"))
    for _ in range(2):
        assert main(["sql", store.url, "SELECT count(*) AS n FROM trajectories", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == [{"n": 160}]
    assert list((tmp_path / "cache" / "sql-verdicts").glob("*.json"))
    assert (tmp_path / "cache" / "sql-verdicts").stat().st_mode & 0o777 == 0o700
