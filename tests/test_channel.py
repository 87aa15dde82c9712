"""The rollout → trainer channel's contract, run on every backend: the campaign folder and the in-memory one."""

from __future__ import annotations

import pytest

from pipelines_lib.trajectory.channel import Channel, WriterConfig
from pipelines_lib.trajectory.folder import FolderChannel
from pipelines_lib.trajectory.memory import MemoryChannel
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.trajectory.trainable import TrainerNeeds
from pipelines_lib.trajectory.window import Window


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["folder", "memory"])
def make_channel(request, local_store):
    def make(clock: Clock | None = None) -> Channel:
        kw = {} if clock is None else {"clock": clock}
        return FolderChannel(local_store, **kw) if request.param == "folder" else MemoryChannel(**kw)
    return make


def _group(pid: str, version: int, worker: str = "w0", size: int = 2) -> list:
    return synthetic_group(prompt_id=pid, group_size=size, worker_id=worker, policy_version=version, seed=1)


def _ids(groups) -> list[str]:
    return [g.group_id for g in groups]


def test_groups_come_out_whole_once_in_version_then_commit_order(make_channel) -> None:
    channel = make_channel()
    w0, w1 = channel.writer("w0", WriterConfig(max_groups=2)), channel.writer("w1", WriterConfig(max_groups=1))
    for version in (1, 0):
        for p in range(2):
            w0.add_group(_group(f"a{version}{p}", version, "w0"))
            w1.add_group(_group(f"b{version}{p}", version, "w1"))
    reader = channel.reader()
    got = []
    while batch := reader.next_groups(3, Window(version=1, eta=1)):
        got += batch
    # v0: w0's one shard of two groups, then w1's two shards; then the same for v1.
    assert _ids(got) == ["a00@w0", "a01@w0", "b00@w1", "b01@w1", "a10@w0", "a11@w0", "b10@w1", "b11@w1"]
    assert all(g.table.num_rows == 2 and g.row_end - g.row_start == 2 for g in got)
    assert reader.cursor.groups_consumed == 8 and reader.drain_events() == []


def test_only_a_flushed_group_is_acknowledged_and_visible(make_channel) -> None:
    clock = Clock()
    channel = make_channel(clock)
    writer = channel.writer("w0", WriterConfig(max_groups=2, max_age_s=5.0))
    reader = channel.reader()
    assert writer.add_group(_group("p0", 0)) == []
    assert reader.next_groups(4, Window(version=0, eta=0)) == []
    clock.now = 4.0
    assert writer.next_flush_in() == pytest.approx(1.0) and writer.flush_due() == []
    clock.now = 5.0
    [info] = writer.flush_due()
    assert (info.group_ids, info.n_groups, info.seq) == (("p0@w0",), 1, 0)
    assert _ids(reader.next_groups(4, Window(version=0, eta=0))) == ["p0@w0"]


def test_groups_the_window_moved_past_are_dropped_with_the_eta_reason(make_channel) -> None:
    channel = make_channel()
    writer = channel.writer("w0", WriterConfig(max_groups=3))
    for p in range(3):
        writer.add_group(_group(f"old{p}", 0))
    writer.add_group(_group("new", 2))
    writer.flush()
    reader = channel.reader()
    assert _ids(reader.next_groups(1, Window(version=0, eta=0))) == ["old0@w0"]
    assert _ids(reader.next_groups(4, Window(version=2, eta=1))) == ["new@w0"]
    [event] = reader.drain_events()
    assert (event.kind, event.groups) == ("dropped_stale", ("old1@w0", "old2@w0"))
    assert event.reason == "version 0 < window start 1 (trainer version 2, eta 1)"
    assert reader.cursor.groups_dropped_stale == 2 and reader.cursor.retired_below == 1


def test_a_reader_from_another_readers_cursor_hands_out_exactly_the_rest(make_channel) -> None:
    channel = make_channel()
    writer = channel.writer("w0", WriterConfig(max_groups=3))
    for p in range(5):
        writer.add_group(_group(f"p{p}", 0))
    writer.flush()
    first = channel.reader()
    head = first.next_groups(2, Window(version=0, eta=0))  # stops inside the first shard
    resumed = channel.reader(cursor=first.cursor.copy())
    rest = resumed.next_groups(10, Window(version=0, eta=0))
    assert _ids(head) + _ids(rest) == [f"p{p}@w0" for p in range(5)]


def test_a_group_the_trainer_cannot_train_on_is_skipped_with_its_reason(make_channel) -> None:
    channel = make_channel()
    writer = channel.writer("w0", WriterConfig(max_groups=1))
    writer.add_group(_group("three", 0, size=3))
    writer.add_group(_group("two", 0))
    reader = channel.reader(needs=TrainerNeeds(group_size=2, max_tokens=512, vocab_size=512))
    assert _ids(reader.next_groups(4, Window(version=0, eta=0))) == ["two@w0"]
    [event] = reader.drain_events()
    assert (event.kind, event.groups) == ("skipped", ("three@w0",))
    assert event.reason == "group three@w0 has 3 rows, the campaign's group_size is 2"
    assert reader.cursor.groups_skipped == 1


def test_a_group_handed_out_is_read_again_by_its_address(make_channel) -> None:
    channel = make_channel()
    writer = channel.writer("w0", WriterConfig(max_groups=3))
    for p in range(3):
        writer.add_group(_group(f"p{p}", 1))
    writer.flush()
    handed = channel.reader().next_groups(3, Window(version=1, eta=0))
    again = channel.reader()  # a fresh reader, as a restarted trainer replaying a logged step has
    for g in handed:
        assert again.reread(g.shard, g.row_start, g.row_end).equals(g.table)
    assert again.cursor.groups_consumed == 0  # reading a logged group again hands nothing out


def test_a_workers_committed_groups_are_listed_across_its_starts(make_channel) -> None:
    channel = make_channel()
    for start, groups in (("rollout0.a1", ("p0", "p1")), ("rollout0.b2", ("p2",)), ("rollout1.c3", ("q0",))):
        writer = channel.writer(start)
        for pid in groups:
            writer.add_group(_group(pid, 0, start))
        writer.flush()
    channel.writer("rollout0.d4").add_group(_group("unflushed", 0, "rollout0.d4"))
    assert channel.committed_groups("rollout0") == {"p0@rollout0.a1", "p1@rollout0.a1", "p2@rollout0.b2"}
    assert channel.committed_groups("rollout2") == set()
