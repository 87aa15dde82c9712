"""Returning the C heap that compiles leave behind to the OS (``pipelines_lib.heap``)."""

from __future__ import annotations

import ctypes
import platform

import jax
import jax.numpy as jnp
import pytest

from pipelines_lib import heap

MIB = 2**20


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return 1024 * next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _leave_freed_heap(n_bytes: int) -> int:
    """Allocate and touch ``n_bytes`` of small C heap blocks, then free all but the last: glibc keeps the freed
    ones (the block still in use above them stops it from shrinking the heap), as it keeps a compiler's.
    Returns the kept block, for the caller to free."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(n_bytes // 4096)]
    for block in blocks:
        ctypes.memset(block, 1, 4096)
    for block in blocks[:-1]:
        libc.free(block)
    return blocks[-1]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_compile_at_least_the_threshold_long_returns_the_freed_heap_and_a_shorter_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert heap.trim_heap_after_compiles() is None
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    monkeypatch.setattr(heap, "TRIM_AFTER_COMPILE_S", 1e9)  # every compile is shorter
    kept = _leave_freed_heap(256 * MIB)
    before = _rss_bytes()
    jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(7))  # a function of its own: it compiles here
    assert _rss_bytes() > before - 64 * MIB  # nothing returned
    monkeypatch.setattr(heap, "TRIM_AFTER_COMPILE_S", 0.0)  # every compile is long enough
    jax.jit(lambda x: x * 5.0 - 1.0)(jnp.ones(7))
    assert _rss_bytes() < before - 192 * MIB  # the freed blocks went back to the OS
    libc.free(kept)


def test_without_glibc_nothing_is_installed_and_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    reason = heap.trim_heap_after_compiles()
    assert reason is not None and "no malloc_trim" in reason
