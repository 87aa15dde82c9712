"""Give the memory XLA's compiler freed back to the OS after each big compile (glibc's ``malloc_trim``).

Compiling a large program (the train step of a 0.6 B-parameter model with remat: gigabytes of compiler heap
on CPU) allocates many small blocks that the compiler frees when it is done. glibc keeps freed memory in its
arenas for reuse instead of returning it, and the step's working memory (XLA's temporaries, one block of
GiBs) is mapped afresh rather than taken from there. So the compiler's peak heap stays resident on top of
the step's own peak for as long as the process lives. ``malloc_trim(0)`` hands every whole free page of
every arena back to the kernel.

``trim_heap_after_compiles()`` does that right after every XLA compile that took at least
``TRIM_AFTER_COMPILE_S``: inside the first call of a jitted function, after compiling and *before* running,
so the first step's peak is already without the compiler's heap. It listens to JAX's backend-compile
event, so every compile of the process (the train step, a reference forward) is covered by one call. Short
compiles leave little to return and are skipped; the trim itself takes a fraction of a second per GiB it returns.

Only glibc has ``malloc_trim``; elsewhere (macOS, musl) the call installs nothing and says why. glibc's
environment settings are no substitute: ``MALLOC_TRIM_THRESHOLD_`` only shortens the top of an arena, not
the freed blocks below blocks still in use, and ``MALLOC_MMAP_THRESHOLD_=65536`` (small blocks mapped, so
freed straight back) lowered the Qwen3-0.6B-shaped step's peak barely more than the trim, and must
be set before the process starts.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable

import jax

TRIM_AFTER_COMPILE_S = 1.0
"""Compiles at least this long are followed by a trim (the train step's first compile takes tens of seconds
on CPU; the tiny programs of eager operations take milliseconds)."""

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
"""What JAX records when XLA finishes compiling (or loads a program from the persistent cache)."""

_installed: list[Callable[..., None]] = []


def _malloc_trim() -> Callable[[int], int] | str:
    """glibc's ``malloc_trim``, or why this process has none."""
    libc, version = platform.libc_ver()
    if libc != "glibc":
        return f"the C library is {libc or 'not glibc'} {version}".rstrip() + ", which has no malloc_trim"
    trim = ctypes.CDLL(None).malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_heap_after_compiles() -> str | None:
    """Trim the C heap after every XLA compile of at least ``TRIM_AFTER_COMPILE_S`` in this process (once per
    process; later calls do nothing). Returns ``None`` when installed, else the reason it cannot be."""
    trim = _malloc_trim()
    if isinstance(trim, str):
        return f"compiler memory is not returned to the OS after compiles: {trim}"
    if not _installed:
        def after(event: str, duration_s: float, **_: object) -> None:
            if event == _BACKEND_COMPILE_EVENT and duration_s >= TRIM_AFTER_COMPILE_S:
                trim(0)

        jax.monitoring.register_event_duration_secs_listener(after)
        _installed.append(after)
    return None
