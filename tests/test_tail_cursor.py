"""The compact tail cursor and incremental tailing: bounded by writers x versions, exact through deltas, one
listing per short batch."""

from __future__ import annotations

import json

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import WriterConfig
from pipelines_lib.trajectory.cursor import TailCursor
from pipelines_lib.trajectory.reader import ShardTailer
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.window import Window
from pipelines_lib.trajectory.writer import ShardWriter


def _write(store: Store, *, version: int, writers: list[ShardWriter], shards_per_writer: int,
           tag: str = "") -> list[str]:
    """One group per shard, round robin over ``writers``; returns the group ids in name order."""
    ids = []
    for i in range(shards_per_writer):
        for w in writers:
            g = synthetic_group(prompt_id=f"v{version}.{w.worker_id}.{i}{tag}", group_size=2, worker_id=w.worker_id,
                                policy_version=version, seed=i, max_len=16)
            w.add_group(g)
            ids.append((w.worker_id, w.committed[-1].seq, g[0].group_id))
    return [gid for *_, gid in sorted(ids)]


def _writers(store: Store, n: int) -> list[ShardWriter]:
    return [ShardWriter(store, worker_id=f"w{i}", config=WriterConfig(max_groups=1)) for i in range(n)]


def _drain(tailer: ShardTailer, window: Window, batch: int = 3) -> list[str]:
    out = []
    while got := tailer.next_groups(batch, window):
        out += [g.group_id for g in got]
    return out


def test_the_cursor_size_is_bounded_by_writers_and_versions_not_by_shards(local_store: Store) -> None:
    writers = _writers(local_store, 2)
    sizes = []
    for shards in (2, 20):
        for v in (0, 1):
            _write(local_store, version=v, writers=writers, shards_per_writer=shards)
        tailer = ShardTailer(local_store)
        _drain(tailer, Window(version=1, eta=1))
        sizes.append(len(tailer.cursor.to_json()))
        assert tailer.cursor.marks == {v: {w.worker_id: max(i.seq for i in w.committed if i.version == v)
                                           for w in writers} for v in (0, 1)}
    assert sizes[1] < sizes[0] + 16  # ten times the shards: only the digits of the seqs and totals grow


def test_deltas_rebuild_every_cursor_exactly_through_partial_shards_and_retirement(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=3))
    for v in range(4):
        for i in range(7):
            w.add_group(synthetic_group(prompt_id=f"v{v}.{i}", group_size=2, worker_id="w0", policy_version=v,
                                        seed=i, max_len=16))
        w.flush()
    tailer = ShardTailer(local_store)
    rebuilt, deltas = TailCursor(), []
    for version in range(4):
        for _ in range(2):  # two groups a step: shards of three groups end partly handed out
            before = tailer.cursor.copy()
            tailer.next_groups(2, Window(version=version, eta=1))
            deltas.append(tailer.cursor.delta_json(before))
            rebuilt = rebuilt.after(deltas[-1])
            assert rebuilt == tailer.cursor
    assert tailer.cursor.groups_dropped_stale > 0 and tailer.cursor.retired_below == 2
    assert any(json.loads(d)["partial"] for d in deltas)
    assert max(len(d) for d in deltas) < 400  # what a consumption log carries, whatever the campaign's size


def test_a_format_1_cursor_resumes_where_it_left_off(local_store: Store) -> None:
    writers = _writers(local_store, 2)
    expected = _write(local_store, version=0, writers=writers, shards_per_writer=4)
    tailer = ShardTailer(local_store)
    first = [g.group_id for g in tailer.next_groups(3, Window(version=0, eta=0))]
    folder = layout.version_dir(0)
    done = [n for n in local_store.list(folder) if tailer.cursor.is_done(layout.parse_shard_path(f"{folder}/{n}"))]
    old = json.dumps({"done": {"0": done}, "partial": {}, "retired_below": 0, "groups_consumed": 3,
                      "groups_dropped_stale": 0, "shards_skipped": 0})
    resumed = ShardTailer(local_store, cursor=TailCursor.from_json(old))
    assert first + _drain(resumed, Window(version=0, eta=0)) == expected


def test_draining_a_window_lists_each_folder_once_per_short_batch_not_once_per_call(
        local_store: Store, monkeypatch) -> None:
    writers = _writers(local_store, 3)
    for v in (0, 1):
        _write(local_store, version=v, writers=writers, shards_per_writer=10)
    listed: list[str] = []
    real_list = local_store.list
    monkeypatch.setattr(local_store, "list", lambda rel, **kw: listed.append(rel) or real_list(rel, **kw))
    tailer = ShardTailer(local_store)
    got = _drain(tailer, Window(version=1, eta=1), batch=2)
    assert len(got) == 60
    # 31 calls: the first lists both folders, the last (empty) lists them again to see nothing new.
    assert sorted(listed) == [layout.version_dir(0)] * 2 + [layout.version_dir(1)] * 2
    _write(local_store, version=1, writers=writers[:1], shards_per_writer=1, tag="new")
    assert len(tailer.next_groups(2, Window(version=1, eta=1))) == 1  # a poll still sees a new shard


def test_a_shard_listed_below_its_writers_mark_is_skipped_with_the_reason(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=1), first_seq=5)
    _write(local_store, version=0, writers=[w], shards_per_writer=1)
    tailer = ShardTailer(local_store)
    assert len(tailer.next_groups(2, Window(version=0, eta=0))) == 1
    late = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=1), first_seq=2)
    _write(local_store, version=0, writers=[late], shards_per_writer=1)  # out of seq order: writers never do this
    assert tailer.next_groups(2, Window(version=0, eta=0)) == []
    [event] = tailer.drain_events()
    assert event.kind == "skipped" and "out of seq order" in event.reason and event.shard.endswith("w0-00000002-1.arrow")


def test_moving_past_a_version_counts_its_unopened_shards_from_their_names_without_reading_them(
        local_store: Store, monkeypatch) -> None:
    w = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=3))
    for i in range(9):
        w.add_group(synthetic_group(prompt_id=f"p{i}", group_size=2, worker_id="w0", policy_version=0, seed=i,
                                    max_len=16))
    tailer = ShardTailer(local_store)
    first = tailer.next_groups(2, Window(version=0, eta=0))  # the first shard, partly handed out
    read: list[str] = []
    real_read = local_store.read
    monkeypatch.setattr(local_store, "read", lambda rel: read.append(rel) or real_read(rel))
    assert tailer.next_groups(2, Window(version=1, eta=0)) == []
    assert read == []
    events = tailer.drain_events()
    partly, *unopened = [info for info in w.committed]
    assert [(e.shard, e.groups, e.unread_groups) for e in events] == [
        (partly.path, partly.group_ids[2:], 0), *[(s.path, (), 3) for s in unopened]]
    assert tailer.cursor.groups_dropped_stale == 7 and len(first) == 2


def test_a_shard_with_an_older_name_is_still_read_to_name_its_dropped_groups(local_store: Store) -> None:
    w = ShardWriter(local_store, worker_id="w0", config=WriterConfig(max_groups=2))
    for i in range(2):
        w.add_group(synthetic_group(prompt_id=f"p{i}", group_size=2, worker_id="w0", policy_version=0, seed=i,
                                    max_len=16))
    [info] = w.committed
    older = layout.shard_path(0, "w0", info.seq)  # the name writers used before it carried the group count
    local_store.create(older, local_store.read(info.path))
    local_store.delete(info.path)
    tailer = ShardTailer(local_store)
    assert tailer.next_groups(2, Window(version=1, eta=0)) == []
    [event] = tailer.drain_events()
    assert (event.shard, event.groups, event.unread_groups) == (older, info.group_ids, 0)
