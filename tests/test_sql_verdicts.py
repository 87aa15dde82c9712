"""Shard verdicts kept between SQL queries, with the rows they vouch for: a repeat query decodes only new shards and
opens no shard file it judged before, and nothing a campaign's writer can do (rewrite a shard, even restoring its
time; plant a verdict file) makes a damaged shard pass or its old rows answer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from bench.storage_scale import build_campaign
from pipelines_lib.audit import sql as sql_module
from pipelines_lib.audit import verdicts as verdicts_module
from pipelines_lib.audit.sql import TRAJECTORIES_SCHEMA, campaign_tables, shard_paths
from pipelines_lib.audit.verdicts import Segment, load_segments, plan_reuse
from pipelines_lib.cli import main
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import encode_shard
from pipelines_lib.trajectory.record import to_table
from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY
from tests.test_audit import _base, _group


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


def shard_files(dataset: ds.Dataset) -> list[str]:
    """The shard files a scan of ``dataset`` opens (kept rows are a memory-mapped table, not a file dataset)."""
    if isinstance(dataset, ds.FileSystemDataset):
        return list(dataset.files)
    if isinstance(dataset, ds.UnionDataset):
        return [f for child in dataset.children for f in shard_files(child)]
    return []


def every_row(tables: sql_module.CampaignTables) -> list[dict]:
    order = [("shard", "ascending"), ("trajectory_id", "ascending")]
    return tables.tables["trajectories"].to_table().sort_by(order).to_pylist()


def test_a_repeat_query_opens_no_shard_file_and_answers_with_the_rows_the_files_hold(tmp_path: Path,
                                                                                      settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    from_files = campaign_tables(store)  # no kept rows: a scan of the shard files
    assert len(shard_files(from_files.tables["trajectories"])) == 40
    campaign_tables(store, verdicts=tmp_path / "kept")
    repeat = campaign_tables(store, verdicts=tmp_path / "kept")
    assert shard_files(repeat.tables["trajectories"]) == []
    assert every_row(repeat) == every_row(from_files)
    [segment] = load_segments(tmp_path / "kept", store.url, TRAJECTORIES_SCHEMA)
    assert sorted(segment.shards) == shard_paths(store) and segment.rows.num_rows == 160


def test_a_shard_added_since_is_picked_up_by_the_next_query_and_kept_beside_the_others(tmp_path: Path,
                                                                                         settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    query(store, tmp_path / "kept")
    first = shard_paths(store)[0]
    added = first.replace("-00000000-", "-00000099-")
    (tmp_path / "c" / added).write_bytes((tmp_path / "c" / first).read_bytes())
    n, lines, _ = query(store, tmp_path / "kept")
    assert n == 164 and "40 of 41 shards unchanged since judged valid; checking 1" in lines
    segments = load_segments(tmp_path / "kept", store.url, TRAJECTORIES_SCHEMA)
    assert [len(s.shards) for s in segments] == [40, 1] and added in segments[1].shards
    assert query(store, tmp_path / "kept")[:2] == (164, ["41 of 41 shards unchanged since judged valid; checking 0"])


def test_a_shard_rewritten_with_other_valid_rows_answers_with_its_new_rows(tmp_path: Path, settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    paths = shard_paths(store)
    ids = f"SELECT list(trajectory_id ORDER BY trajectory_id) AS ids FROM trajectories WHERE shard = '{paths[5]}'"
    before = campaign_tables(store, verdicts=tmp_path / "kept").query(ids).to_pylist()
    (tmp_path / "c" / paths[5]).write_bytes((tmp_path / "c" / paths[6]).read_bytes())  # a valid shard's rows
    lines: list[str] = []
    tables = campaign_tables(store, progress=lines.append, verdicts=tmp_path / "kept")
    after = tables.query(ids).to_pylist()
    assert after != before and after == campaign_tables(store).query(ids).to_pylist()  # what the file holds now
    # Its 39 unchanged neighbours' rows are carried into a new segment, not decoded again; the old one is gone.
    assert "39 of 40 shards unchanged since judged valid; checking 1" in lines
    assert shard_files(tables.tables["trajectories"]) == [] and every_row(tables) == every_row(campaign_tables(store))
    assert len(list((tmp_path / "kept").glob("*.arrow"))) == 1


def test_kept_segments_are_merged_into_one_once_there_are_kept_segments_of_them(
        tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_module, "KEPT_SEGMENTS", 2)
    store = build_campaign(tmp_path / "c", 40)
    first = shard_paths(store)[0]
    sizes = []
    for seq in range(91, 94):  # each query finds one shard more
        query(store, tmp_path / "kept")
        sizes.append([len(s.shards) for s in load_segments(tmp_path / "kept", store.url, TRAJECTORIES_SCHEMA)])
        (tmp_path / "c" / first.replace("-00000000-", f"-000000{seq}-")).write_bytes(
            (tmp_path / "c" / first).read_bytes())
    n, lines, _ = query(store, tmp_path / "kept")
    sizes.append([len(s.shards) for s in load_segments(tmp_path / "kept", store.url, TRAJECTORIES_SCHEMA)])
    assert sizes == [[40], [40, 1], [42], [42, 1]] and n == 43 * 4
    assert len(list((tmp_path / "kept").glob("*.arrow"))) == 2


def test_a_kept_segment_others_may_write_or_that_is_gone_is_not_used(tmp_path: Path, settled: None) -> None:
    store = build_campaign(tmp_path / "c", 40)
    query(store, tmp_path / "kept")
    (segment,) = (tmp_path / "kept").glob("*.arrow")
    segment.chmod(0o666)
    n, lines, _ = query(store, tmp_path / "kept")
    assert n == 160 and not any("unchanged since judged valid" in line for line in lines)
    for kept in (tmp_path / "kept").glob("*.arrow"):
        kept.unlink()  # the index stays, naming a segment that is gone
    n, lines, _ = query(store, tmp_path / "kept")
    assert n == 160 and not any("unchanged since judged valid" in line for line in lines)


def test_an_older_minor_shard_is_kept_with_the_columns_its_reader_derives(local_store: Store, tmp_path: Path,
                                                                          settled: None) -> None:
    _base(local_store)
    old = to_table(_group("old", 2, "w9")).drop_columns(["version"]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"1.0"})
    local_store.create("trajectories/v00000002/w9-00000000.arrow", encode_shard(old, {"worker_id": "w9"}))
    by_version = "SELECT version, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1"
    expected = [{"version": 0, "n": 8}, {"version": 1, "n": 8}, {"version": 2, "n": 2}]
    for _ in range(2):
        tables = campaign_tables(local_store, verdicts=tmp_path / "kept")
        assert tables.query(by_version).to_pylist() == expected
    assert shard_files(tables.tables["trajectories"]) == []


def test_a_bucket_campaign_checks_every_shard_on_every_query_and_keeps_nothing(gcs_store: Store, tmp_path: Path,
                                                                               settled: None) -> None:
    _base(gcs_store)
    for _ in range(2):
        lines: list[str] = []
        tables = campaign_tables(gcs_store, progress=lines.append, verdicts=tmp_path / "kept")
        assert tables.query("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 16}]
        assert not any("unchanged since judged valid" in line for line in lines)
        assert len(shard_files(tables.tables["trajectories"])) == 4  # scanned from the bucket's objects
    assert not (tmp_path / "kept").exists() or not list((tmp_path / "kept").iterdir())


def segment(name: str, **shards: int) -> Segment:
    return Segment(name=name, shards={p: [i] for p, i in shards.items()}, rows=pa.table({}))


def test_reuse_keeps_whole_segments_carries_the_unchanged_shards_of_the_others_and_merges_past_the_limit() -> None:
    a, b, c = segment("a", s1=1, s2=2), segment("b", s3=3, s4=4), segment("c", s2=2, s5=5)
    plan = plan_reuse([a, b, c], {"s1": [1], "s2": [2], "s3": [9], "s4": [4], "s5": [5], "s6": None}, max_segments=3)
    # b holds a changed shard: its unchanged one is carried; c repeats a's s2: only its own s5 is carried.
    assert plan.whole == [a] and {p: s.name for p, s in plan.carried.items()} == {"s4": "b", "s5": "c"}
    assert plan.changed
    unchanged = plan_reuse([a, b], {"s1": [1], "s2": [2], "s3": [3], "s4": [4], "s6": None}, max_segments=2)
    assert unchanged.whole == [a, b] and not unchanged.carried and not unchanged.changed  # s6 unsettled: not kept
    merged = plan_reuse([a, b], {"s1": [1], "s2": [2], "s3": [3], "s4": [4], "s7": [7]}, max_segments=2)
    assert merged.whole == [] and sorted(merged.carried) == ["s1", "s2", "s3", "s4"] and merged.changed
