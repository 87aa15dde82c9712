"""One contract, every backend: the local folder and gcsfs against a real GCS-API emulator."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines_lib.storage.errors import AlreadyExistsError, NotFoundError, StorageError, TooLargeError
from pipelines_lib.storage.retry import RetryPolicy
from pipelines_lib.storage.store import TEMP_MARKER, Store, normalize_url


def test_create_then_read_round_trips_bytes(store: Store) -> None:
    store.create("a/b/object.bin", b"\x00payload\xff")
    assert store.read("a/b/object.bin") == b"\x00payload\xff"
    assert store.exists("a/b/object.bin")
    assert store.size("a/b/object.bin") == 9


def test_create_refuses_to_overwrite_and_names_the_url(store: Store) -> None:
    store.create("x.json", b"first")
    with pytest.raises(AlreadyExistsError) as err:
        store.create("x.json", b"second")
    assert store.uri("x.json") in str(err.value)
    assert store.read("x.json") == b"first"


def test_read_of_missing_object_names_the_url(store: Store) -> None:
    with pytest.raises(NotFoundError, match="nope.json"):
        store.read("nope.json")


def test_a_read_with_a_cap_refuses_a_larger_object_naming_it_and_reads_one_at_the_cap(store: Store) -> None:
    store.create("big.arrow", b"x" * 1000)
    assert store.read("big.arrow", max_bytes=1000) == b"x" * 1000
    with pytest.raises(TooLargeError, match="big.arrow"):
        store.read("big.arrow", max_bytes=999)


def test_race_for_one_name_has_exactly_one_winner(store: Store) -> None:
    winners, losers = [], []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            store.create("race/shard.arrow", f"writer-{i}".encode())
            winners.append(i)
        except AlreadyExistsError:
            losers.append(i)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == 7
    assert store.read("race/shard.arrow") == f"writer-{winners[0]}".encode()


def test_list_is_sorted_scoped_and_hides_temporaries(store: Store) -> None:
    for name in ["v2/b", "v2/a", "v1/c", "v10/d"]:
        store.create(f"t/{name}", b"x")
    assert store.list("t") == ["v1", "v10", "v2"]
    assert store.list("t/v2") == ["a", "b"]
    assert store.list("t/missing") == []
    # A listing made before a new prefix appears must not hide it (gcsfs caches listings).
    store.create("t/v3/e", b"x")
    assert store.list("t") == ["v1", "v10", "v2", "v3"]
    assert store.walk("t/v2") == ["t/v2/a", "t/v2/b"]


def test_walk_leaves_out_the_folders_it_is_told_to_skip(store: Store) -> None:
    for rel in ("top.json", "a/x", "a/b/y", "a/bc/z", "c/b/w"):
        store.create(rel, b"1")
    assert store.walk("", skip=lambda folder: folder == "a/b") == ["a/bc/z", "a/x", "c/b/w", "top.json"]
    assert store.walk("a", skip=lambda folder: folder.startswith("a/")) == ["a/x"]
    assert store.walk("") == ["a/b/y", "a/bc/z", "a/x", "c/b/w", "top.json"]


def test_pointer_moves_forward_only(store: Store) -> None:
    assert store.read_pointer("weights/LATEST.json") is None
    assert store.advance_pointer("weights/LATEST.json", {"version": 1, "path": "weights/v00000001"})
    assert store.advance_pointer("weights/LATEST.json", {"version": 3, "path": "weights/v00000003"})
    # A stale writer arriving late cannot move it back, nor can a repeat of the same version.
    assert not store.advance_pointer("weights/LATEST.json", {"version": 2, "path": "weights/v00000002"})
    assert not store.advance_pointer("weights/LATEST.json", {"version": 3, "path": "other"})
    assert store.read_pointer("weights/LATEST.json")["version"] == 3
    # The plain-file mirror that tools without rollstream read shows the same.
    assert json.loads(store.read("weights/LATEST.json"))["version"] == 3


def test_concurrent_pointer_writers_end_at_the_maximum(store: Store) -> None:
    threads = [threading.Thread(target=store.advance_pointer, args=("p/LATEST.json", {"version": v}))
               for v in [5, 2, 9, 1, 7, 3]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.read_pointer("p/LATEST.json")["version"] == 9


def test_dotdot_paths_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="'..'"):
        store.create("../escape", b"x")


_KILL_WRITER = """
import sys
from pipelines_lib.storage.store import Store
store = Store(sys.argv[1], storage_options={opts})
payload = b"z" * (48 * 2**20)
for i in range(1000):
    print(f"writing {{i}}", flush=True)
    store.create(f"big/obj-{{i:04d}}", payload)
"""


def test_writer_killed_mid_write_leaves_no_partial_object(store: Store) -> None:
    opts = repr(getattr(store.fs, "storage_options", {}) if store.protocol == "gs" else {})
    proc = subprocess.Popen([sys.executable, "-c", _KILL_WRITER.format(opts=opts), store.url],
                            stdout=subprocess.PIPE, cwd=Path(__file__).parents[1])
    # Killed once the first object is committed and the second one's write has begun (on a local folder: its
    # hidden temporary exists).
    assert [proc.stdout.readline().strip() for _ in range(2)] == [b"writing 0", b"writing 1"]
    deadline = time.monotonic() + 60
    while (store.protocol == "file" and time.monotonic() < deadline
           and not any(TEMP_MARKER in n for n in store.list("big", include_hidden=True))):
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    visible = store.list("big")
    assert visible, "writer never committed anything before the kill"
    for name in visible:
        assert store.size(f"big/{name}") == 48 * 2**20, f"partial object {name} is visible"
    # Only hidden temporaries may remain, and readers never see them.
    assert all(TEMP_MARKER in n for n in store.list("big", include_hidden=True) if n not in visible)


def test_normalize_url_turns_paths_into_absolute_file_urls(tmp_path: Path) -> None:
    assert normalize_url(str(tmp_path / "c") + "/") == f"file://{tmp_path}/c"
    assert normalize_url("gs://bucket/prefix/") == "gs://bucket/prefix"


def _flaky(fn: Callable[..., bytes], failures: int, exc: Exception) -> Callable[..., bytes]:
    """``fn`` that raises ``exc`` on its first ``failures`` calls (a transient fault under the store's retry)."""
    calls = 0

    def wrapped(*args: object) -> bytes:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise exc
        return fn(*args)
    return wrapped


def test_transient_errors_are_retried_then_succeed(local_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    local_store.create("obj", b"data")
    local_store.retry = RetryPolicy(attempts=4, base_delay_s=0.0, max_delay_s=0.0)
    # A local store reads through its own primitive (not fsspec); the fault goes where the bytes come from.
    monkeypatch.setattr(local_store, "_read_local",
                        _flaky(local_store._read_local, failures=3, exc=ConnectionResetError("reset by peer")))
    assert local_store.read("obj") == b"data"
    assert local_store.retries == 3


def test_retry_jitter_leaves_the_global_random_state_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    store = Store(str(tmp_path), retry=RetryPolicy(attempts=4, base_delay_s=0.5, max_delay_s=1.0), sleep=slept.append)
    store.create("obj", b"data")
    monkeypatch.setattr(store, "_read_local",
                        _flaky(store._read_local, failures=3, exc=ConnectionResetError("reset by peer")))
    before = random.getstate()
    assert store.read("obj") == b"data"
    assert random.getstate() == before
    assert len(slept) == 3 and all(0 <= s <= 1.0 for s in slept)


def test_exhausted_retries_raise_with_url_and_operation(local_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    local_store.create("obj", b"data")
    local_store.retry = RetryPolicy(attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    monkeypatch.setattr(local_store, "_read_local",
                        _flaky(local_store._read_local, failures=5, exc=TimeoutError("slow")))
    with pytest.raises(StorageError, match=r"storage read file://.*obj: TimeoutError: slow \(gave up after 2 tries"):
        local_store.read("obj")
    assert local_store.retries == 1


@pytest.mark.slow  # gcsfs retries 6 times internally with backoff (about 35 s) before our layer sees it
def test_unreachable_gcs_endpoint_fails_with_the_url() -> None:
    store = Store("gs://bucket/c", storage_options={"endpoint_url": "http://127.0.0.1:9", "token": "anon"},
                  retry=RetryPolicy(attempts=2, base_delay_s=0.0, max_delay_s=0.01, deadline_s=5))
    with pytest.raises(StorageError, match="gs://bucket/c/x"):
        store.read("x")


def test_list_if_changed_lists_a_settled_local_folder_again_only_after_a_create(local_store: Store) -> None:
    local_store.create("f/a", b"1")
    names, token = local_store.list_if_changed("f", None)
    assert names == ["a"] and token is None  # just changed: its time may not move on the next create
    folder = local_store.local_path("f")
    settled = time.time_ns() - 10**10
    os.utime(folder, ns=(settled, settled))
    assert local_store.list_if_changed("f", None) == (["a"], settled)
    assert local_store.list_if_changed("f", settled) == (None, settled)
    local_store.create("f/b", b"2")
    assert local_store.list_if_changed("f", settled)[0] == ["a", "b"]
    assert local_store.list_if_changed("missing", None) == ([], None)
