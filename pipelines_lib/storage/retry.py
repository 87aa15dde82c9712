"""When a storage call is tried again, and for how long any storage call may take.

``Store`` retries what ``is_transient`` calls transient (HTTP 408/429/5xx, connection resets, timeouts) under a
``RetryPolicy``: capped exponential backoff with full jitter (``jitter``), within a deadline. Calls made by other
clients (Orbax) have no deadline of their own; ``call_with_deadline`` gives them one.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pipelines_lib.storage.errors import StorageError

T = TypeVar("T")

_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}
_jitter = random.Random()
"""Retry jitter's own generator: a retry never moves the global ``random`` state that user code may have seeded."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retries of transient storage errors: capped exponential backoff with full jitter, within a deadline."""

    attempts: int = 6
    """Tries in all, the first included."""
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    deadline_s: float = 60.0
    """No new try starts after this many seconds since the first: an operation on unreachable storage fails
    within ``deadline_s`` plus one ``request_timeout_s``."""
    request_timeout_s: float = 30.0
    """Longest one storage request may take (gcsfs ``requests_timeout``); a request past it is a transient
    timeout, retried within the deadline. An explicit ``requests_timeout`` storage option wins."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError(
                f"RetryPolicy delays must satisfy 0 <= base_delay_s <= max_delay_s, "
                f"got {self.base_delay_s}, {self.max_delay_s}"
            )
        for name in ("deadline_s", "request_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):  # also refuses nan
                raise ValueError(f"RetryPolicy.{name} must be a finite number of seconds > 0, got {value}")


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same request may succeed."""
    if isinstance(exc, (FileExistsError, FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    code = getattr(exc, "code", None) or getattr(exc, "status", None)
    if isinstance(code, int):
        return code in _TRANSIENT_HTTP
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__
    return name in {"ClientError", "ClientOSError", "ServerDisconnectedError", "ClientPayloadError",
                    "ClientConnectorError", "ClientResponseError", "TransferEncodingError",
                    "ContentLengthError", "ServerTimeoutError"}


def storage_down(e: BaseException) -> bool:
    """Whether a ``StorageError`` is the storage failing (a transient error past the retries) rather than one
    object or folder (gone, refused, not a file): a reader names the latter and goes on, and stops on the former."""
    return e.__cause__ is not None and is_transient(e.__cause__)


def call_with_deadline(op: str, url: str, fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()``, or ``StorageError(op, url)`` once ``timeout_s`` passes without its result.

    For storage calls made by other clients (Orbax through tensorstore and etils' gcsfs), which have no deadline
    of their own: tensorstore retries a stalled GCS request up to 32 times with up to 32 s between tries. ``fn``
    runs in a daemon thread that cannot be cancelled; after the error it is abandoned (the stage fails, and its
    process exits). The error's cause is a ``TimeoutError``, so task-level retries treat it as transient.
    """
    if timeout_s <= 0:
        raise ValueError(f"call_with_deadline: timeout_s must be > 0, got {timeout_s}")
    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"storage-{op}", daemon=True).start()
    if not done.wait(timeout_s):
        raise StorageError(op, url, f"no result within {timeout_s:g}s (storage unreachable or stalled?)") from (
            TimeoutError(f"{op} {url}"))
    if "error" in box:
        raise box["error"]
    return box["result"]


def jitter(cap_s: float) -> float:
    """A full-jitter backoff delay: uniform in ``[0, cap_s]``."""
    return _jitter.uniform(0, cap_s)

