"""Shard writer and tailer on both backends: whole groups, flush by size and age, exact resume."""

from __future__ import annotations

import dataclasses
import io
import random

import polars as pl
import pyarrow as pa
import pytest

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.codec import ShardError, encode_shard, read_shard
from pipelines_lib.trajectory.cursor import TailCursor
from pipelines_lib.trajectory.reader import ShardTailer
from pipelines_lib.trajectory.record import from_table, group_min_version, to_table
from pipelines_lib.trajectory.schema import (
    CAMPAIGN_KEY,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TRAJECTORY_SCHEMA,
)
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.window import Window
from pipelines_lib.trajectory.writer import ShardWriter


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def group(pid: str, version: int = 0, worker: str = "w0", size: int = 4):
    return synthetic_group(prompt_id=pid, group_size=size, worker_id=worker, policy_version=version, seed=1)


def test_writer_commits_by_group_count(store: Store) -> None:
    w = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=3, max_age_s=100))
    assert w.add_group(group("p0")) == []
    assert w.add_group(group("p1")) == []
    [info] = w.add_group(group("p2"))
    assert info.path == "trajectories/v00000000/w0-00000000-3.arrow"  # three groups, declared in its name
    assert (info.n_groups, info.n_rows) == (3, 12)
    table, prov = read_shard(store, info.path)
    assert table.num_rows == 12 and prov["n_groups"] == 3 and prov["worker_id"] == "w0"


def test_writer_commits_a_slow_trickle_by_age() -> None:
    store = Store("memory://trickle")
    clock = FakeClock()
    w = ShardWriter(store, worker_id="w0", config=WriterConfig(max_groups=100, max_age_s=5.0), clock=clock)
    w.add_group(group("p0"))
    clock.t = 4.9
    assert w.flush_due() == [] and w.next_flush_in() == pytest.approx(0.1)
    clock.t = 5.0
    [info] = w.flush_due()
    assert info.n_groups == 1 and w.buffered_groups == 0 and w.next_flush_in() is None


def test_writer_splits_groups_by_oldest_policy_version(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=10))
    w.add_group(group("a", version=2))
    w.add_group(group("b", version=3))
    infos = w.flush()
    assert [(i.version, i.seq) for i in infos] == [(2, 0), (3, 1)]
    assert local_store.list("trajectories") == ["v00000002", "v00000003"]


def _versions(traj, mask: list[int], versions: list[int]):
    return dataclasses.replace(traj, tokens=[1] * len(mask), loss_mask=mask, logprobs=[0.0] * len(mask),
                               policy_version=versions)


def test_group_min_version_is_the_oldest_version_on_loss_tokens_only() -> None:
    a, b = group("p", size=2)
    # -1 and 0 sit on non-loss tokens (prompt, tool output) and must not count; loss tokens carry 5, 3, 4.
    assert group_min_version([_versions(a, [0, 1, 1], [-1, 5, 5]), _versions(b, [1, 0, 1], [3, 0, 4])]) == 3
    assert group_min_version([_versions(a, [0, 0], [-1, -1]), _versions(b, [], [])]) == 0  # no loss tokens
    with pytest.raises(ValueError, match="policy_version has 1 entries, loss_mask 2"):
        group_min_version([_versions(a, [1, 1], [2])])


def test_shard_provenance_lists_the_policy_versions_of_its_tokens(local_store: Store) -> None:
    a, b = group("p", size=2)
    w = ShardWriter(local_store, worker_id="w0")
    w.add_group([_versions(a, [0, 1, 1], [-1, 5, 7]), _versions(b, [1, 0], [5, -1])])
    [info] = w.flush()
    assert info.version == 5 and read_shard(local_store, info.path, validate=False)[1]["policy_versions"] == [5, 7]


def test_writer_rejects_partial_groups(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0")
    with pytest.raises(ValueError, match=r"not one whole group.*sample_idx \[0, 1, 2\]"):
        w.add_group(group("p0")[:3])


def test_writer_keeps_the_buffer_when_a_commit_fails(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=10))
    w.add_group(group("p0"))
    real_create = local_store.create
    local_store.create = lambda *a: (_ for _ in ()).throw(OSError("disk on fire"))
    with pytest.raises(OSError, match="disk on fire"):
        w.flush()
    assert w.buffered_groups == 1
    local_store.create = real_create
    [info] = w.flush()
    assert info.n_groups == 1 and info.seq == 0


def test_a_second_process_with_the_same_worker_id_is_refused(local_store: Store) -> None:
    a = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=1))
    a.add_group(group("p0"))
    b = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=1))
    with pytest.raises(OSError, match="another process using worker_id 'w0'"):
        b.add_group(group("p1"))


def test_shards_are_readable_by_plain_pyarrow_and_polars(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0")
    w.add_group(group("p0"))
    [info] = w.flush()
    path = local_store.local_path(info.path)
    table = pa.ipc.open_file(str(path)).read_all()
    assert table.schema.metadata[SCHEMA_VERSION_KEY] == SCHEMA_VERSION.encode()
    assert table.num_rows == 4
    df = pl.read_ipc(path)
    assert df["sample_idx"].to_list() == [0, 1, 2, 3]
    assert df["tokens"].list.len().to_list() == [len(t) for t in table.column("tokens").to_pylist()]


def test_records_survive_the_round_trip_exactly() -> None:
    g = group("p0")
    table = to_table(g)
    back = from_table(table)
    assert to_table(back).equals(table)  # lossless once values are in their Arrow types
    assert [t.trajectory_id for t in back] == [t.trajectory_id for t in g]
    assert [list(t.tokens) for t in back] == [list(t.tokens) for t in g]
    assert [[(u.role, u.start, u.end, u.tool_name) for u in t.turns] for t in back] == \
        [[(u.role, u.start, u.end, u.tool_name) for u in t.turns] for t in g]
    assert [t.logprobs for t in back] == [pytest.approx(t.logprobs, abs=1e-6) for t in g]


def _write_campaign(store: Store, *, versions: int, workers: int, groups_per_worker: int) -> list[str]:
    """Writes shards of varied sizes; returns every group id in the order the tailer must yield them."""
    rng = random.Random(0)
    for v in range(versions):
        for wi in range(workers):
            w = ShardWriter(store, worker_id=f"w{wi}", config=WriterConfig(max_groups=rng.randint(1, 4)),
                            first_seq=v * 1000)
            for g in range(groups_per_worker):
                w.add_group(group(f"v{v}-w{wi}-g{g}", version=v, worker=f"w{wi}", size=2))
            w.flush()
    order = []
    for v in range(versions):
        for name in store.list(layout.version_dir(v)):
            table, _ = read_shard(store, f"{layout.version_dir(v)}/{name}")
            order.extend(dict.fromkeys(table.column("group_id").to_pylist()))
    return order


def test_tailer_resumes_from_a_serialised_cursor_without_loss_or_repeat(store: Store) -> None:
    expected = _write_campaign(store, versions=3, workers=2, groups_per_worker=5)
    seen: list[str] = []
    cursor_json = TailCursor().to_json()
    batch_sizes = [3, 1, 4, 2, 5, 7, 3, 100]
    for n in batch_sizes:
        tailer = ShardTailer(store, cursor=TailCursor.from_json(cursor_json))  # a fresh process each time
        seen.extend(g.group_id for g in tailer.next_groups(n, Window(version=2, eta=2)))
        cursor_json = tailer.cursor.to_json()
    assert seen == expected
    assert len(seen) == 30 and TailCursor.from_json(cursor_json).groups_consumed == 30


def test_tailer_sees_only_its_window_and_counts_stale_groups(local_store: Store) -> None:
    expected = _write_campaign(local_store, versions=3, workers=1, groups_per_worker=2)
    tailer = ShardTailer(local_store)
    first = tailer.next_groups(1, Window(version=0, eta=0))
    assert [g.group_id for g in first] == expected[:1]
    # The trainer moved to version 2 with eta = 0: the rest of v0 and all of v1 are now too stale.
    rest = tailer.next_groups(10, Window(version=2, eta=0))
    assert [g.group_id for g in rest] == expected[4:]
    events = tailer.drain_events()
    # The rest of v0's partly handed-out shard is named; v1's shard, never opened, is counted from its name.
    assert [(e.groups, e.unread_groups) for e in events if e.kind == "dropped_stale"] == [
        ((expected[1],), 0), ((), 2)]
    assert tailer.cursor.groups_dropped_stale == 3
    v2 = [layout.parse_shard_path(f"{layout.version_dir(2)}/{n}") for n in local_store.list(layout.version_dir(2))]
    assert tailer.cursor.marks == {2: {sid.worker_id: max(s.seq for s in v2 if s.worker_id == sid.worker_id)
                                       for sid in v2}}


def test_tailer_reports_bad_shards_and_carries_on(store: Store) -> None:
    w = ShardWriter(store, worker_id="good", config=WriterConfig(max_groups=1))
    w.add_group(group("p0"))
    good = to_table(group("p1"))
    d = layout.version_dir(0)
    store.create(f"{d}/bad-00000000.arrow", b"this is not arrow")
    store.create(f"{d}/bad-00000001.arrow", encode_shard(good, {})[:-100])  # truncated
    foreign = pa.table({"x": [1, 2]})
    store.create(f"{d}/bad-00000002.arrow", encode_shard(foreign, {}))
    future = good.replace_schema_metadata({SCHEMA_VERSION_KEY: b"9.0"})
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, future.schema) as f:
        f.write_table(future)
    store.create(f"{d}/bad-00000003.arrow", sink.getvalue())
    broken = to_table(group("p2")).set_column(
        TRAJECTORY_SCHEMA.get_field_index("prompt_len"), "prompt_len", pa.array([0, 0, 0, 0], pa.int32()))
    store.create(f"{d}/bad-00000004.arrow", encode_shard(broken, {}))

    tailer = ShardTailer(store)
    groups = tailer.next_groups(10, Window(version=0, eta=0))
    assert [g.group_id for g in groups] == ["p0@w0"]
    reasons = {e.shard.rsplit("/", 1)[-1]: e.reason for e in tailer.drain_events()}
    assert "unreadable Arrow IPC file" in reasons["bad-00000000.arrow"]
    assert "unreadable Arrow IPC file" in reasons["bad-00000001.arrow"]
    assert "not a rollstream shard" in reasons["bad-00000002.arrow"]
    assert "schema version 9.0 is not readable" in reasons["bad-00000003.arrow"]
    assert "prompt_len 0 outside" in reasons["bad-00000004.arrow"]
    assert tailer.cursor.shards_skipped == 5
    # Skipped shards are not retried forever: the next poll is quiet.
    assert tailer.next_groups(10, Window(version=0, eta=0)) == [] and tailer.drain_events() == []


def test_read_shard_names_the_shard_on_failure(local_store: Store) -> None:
    local_store.create("trajectories/v00000000/x-00000000.arrow", b"junk")
    with pytest.raises(ShardError, match=r"file://.*x-00000000\.arrow: unreadable"):
        read_shard(local_store, "trajectories/v00000000/x-00000000.arrow")


def test_shards_carry_the_group_version_column_and_the_campaign_id(local_store: Store) -> None:
    a, b = group("p", size=2)
    w = ShardWriter(local_store, worker_id="w0")
    w.add_group([_versions(a, [0, 1, 1], [-1, 5, 7]), _versions(b, [1, 0], [6, -1])])
    w.add_group(group("q", version=5))
    [info] = w.flush()
    raw = pa.ipc.open_file(pa.BufferReader(local_store.read(info.path))).read_all()
    assert raw.schema.metadata[SCHEMA_VERSION_KEY] == SCHEMA_VERSION.encode() == b"1.2"
    assert raw.schema.metadata[CAMPAIGN_KEY] == b"campaign"  # the folder's name (local_store is <tmp>/campaign)
    assert raw.column("version").to_pylist() == [5, 5, 5, 5, 5, 5]  # min(5, 7, 6) for p; q is all version 5


def test_a_schema_1_0_shard_still_reads_with_its_version_derived(local_store: Store) -> None:
    """Shards written before ``version`` existed: the reader fills it from the loss tokens, per group."""
    rows = group("p", version=3, size=2) + group("q", version=2, size=3)
    old = to_table(rows).drop_columns(["version"]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"1.0"})
    local_store.create("trajectories/v00000002/w0-00000000.arrow", encode_shard(old, {"worker_id": "w0"}))
    table, prov = read_shard(local_store, "trajectories/v00000002/w0-00000000.arrow")
    assert table.schema.names == TRAJECTORY_SCHEMA.names and prov == {"worker_id": "w0"}
    assert table.column("version").to_pylist() == [3, 3, 2, 2, 2]
    assert table.equals(to_table(rows))  # what a 1.1 writer would have written


def test_validation_reports_a_version_that_is_not_the_groups_oldest(local_store: Store) -> None:
    table = to_table(group("p", version=3))
    bad = table.set_column(TRAJECTORY_SCHEMA.get_field_index("version"), "version", pa.array([3, 3, 2, 3], pa.int32()))
    local_store.create("trajectories/v00000003/w0-00000000.arrow", encode_shard(bad, {}))
    with pytest.raises(ShardError, match="version 2, but the group's oldest loss-token policy_version is 3"):
        read_shard(local_store, "trajectories/v00000003/w0-00000000.arrow")


def test_shards_are_written_and_read_where_pandas_is_not_installed(tmp_path) -> None:
    # An accelerator machine's Python need not have pandas, and before pyarrow 26 some pyarrow helpers import it: a
    # shard write that touched one failed there on every group. `rollstream demo` (shards written, tailed and
    # audited) runs where importing pandas fails.
    script = f"""
import sys

class NoPandas:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'", name=name)

sys.meta_path.insert(0, NoPandas())
from pipelines_lib.demo import run_demo
report = run_demo({str(tmp_path / "c")!r}, echo=lambda line: None).report
print(report.ok, report.shards)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ok, shards = out.stdout.split()
    assert ok == "True" and int(shards) > 0, out.stdout
