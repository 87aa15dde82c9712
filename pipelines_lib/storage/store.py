"""One storage API over fsspec for a campaign folder: local paths, ``file://``, ``gs://`` and ``memory://``.

Everything above this module speaks in paths relative to the campaign URL and never asks which backend it
is on. The backend differences live in exactly one place, ``_create``: how an object is created only if it
does not exist yet.

- local: write ``.<name>.tmp-<nonce>`` in the same folder, fsync, ``os.link`` it to the final name (link
  fails if the name exists, so there is one winner), unlink the temporary. A killed writer leaves at most a
  hidden temporary that readers ignore and the audit reports as an orphan; never a partial object.
- GCS: a single-request upload with ``ifGenerationMatch=0`` (gcsfs ``pipe_file(mode="create")``); object
  creation is atomic on GCS and the precondition gives one winner. gcsfs ``mv`` is copy + delete, so rename
  is never used for atomicity.

Pointers (``weights/LATEST.json``) must move atomically and only forward, which needs compare-and-swap. GCS
emulators do not honour non-zero generation preconditions, so rather than trusting one, a pointer is the
*maximum* of create-only entries ``<pointer>.d/<key:012d>.json``: a stale writer can add an older entry but
never lower the maximum. ``LATEST.json`` itself is then rewritten as a plain-tool mirror of that maximum. An entry counts only when
its name and content agree (``<key:012d>.json`` holding that integer ``key`` >= 0): a stray ``latest.json``,
``zzz.json`` or an entry whose name disagrees with its version is skipped (and logged; the audit reports it),
so junk can never move a pointer, backwards or forwards.

Local reads open only regular files inside the campaign folder: a FIFO or device named like an object would
block the reader for good, and a symlink leading outside would let a campaign folder read anything on the
machine. Both raise ``NotAnObjectError`` (checked on the resolved file before it is opened).

Transient errors (HTTP 408/429/5xx, connection resets, timeouts; ``storage.retry``) are retried with capped
exponential backoff inside a deadline; anything else, or running out of retries, raises ``StorageError`` naming op and URL. Every
request has a timeout (``RetryPolicy.request_timeout_s``, gcsfs's ``requests_timeout``), so an endpoint that
accepts connections and never answers costs at most ``deadline_s`` plus one request timeout per operation; calls
made by other clients (Orbax) are bounded by ``Store.external_deadline_s`` (``call_external``).
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pipelines_lib.storage.errors import (
    MAX_JSON_BYTES,
    AlreadyExistsError,
    NotAnObjectError,
    NotFoundError,
    StorageError,
    TooLargeError,
    json_problem,
    raise_unless_gone,
)
from pipelines_lib.storage.layout import parse_pointer_entry, pointer_entry_problem
from pipelines_lib.storage.retry import RetryPolicy, call_with_deadline, is_transient, jitter

if TYPE_CHECKING:
    import fsspec

T = TypeVar("T")

TEMP_MARKER = ".tmp-"
"""Temporary objects are hidden (leading dot) and carry this marker; readers skip them, audits report them."""

SETTLED_S = 1.0
"""How long a local folder must have been unchanged before ``list_if_changed`` trusts its modification time."""

_log = logging.getLogger(__name__)


def normalize_url(url: str) -> str:
    """A plain path becomes an absolute ``file://`` URL; trailing slashes go.

    An object-store URL without a bucket (``gs:///campaigns/x``, what ``gs://{{ $ROLLSTREAM_BUCKET }}/...``
    becomes when the variable is unset) is refused: fsspec would read its first folder as the bucket."""
    if "://" not in url:
        url = "file://" + str(Path(url).expanduser().resolve())
    protocol, rest = url.split("://", 1)
    if protocol != "file" and (not rest or rest.startswith("/")):
        raise ValueError(f"{url}: no bucket (nothing between '{protocol}://' and the path); "
                         "is a variable that names it unset?")
    return url.rstrip("/")


class Store:
    """Create-only object storage rooted at one campaign URL."""

    def __init__(self, url: str, *, retry: RetryPolicy | None = None, storage_options: dict[str, Any] | None = None,
                 external_deadline_s: float = 600.0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = normalize_url(url)
        self.protocol = self.url.split("://", 1)[0]
        self.retry = retry or RetryPolicy()
        if not 0 < external_deadline_s < float("inf"):
            raise ValueError(f"Store.external_deadline_s must be a finite number of seconds > 0, "
                             f"got {external_deadline_s}")
        self.external_deadline_s = external_deadline_s
        """Longest a call by another client of this storage (an Orbax save or restore) may take."""
        self._sleep = sleep
        options = dict(storage_options or {})
        if self.protocol in ("gs", "gcs"):
            options.setdefault("requests_timeout", self.retry.request_timeout_s)
        self.storage_options = options
        """What the backend was opened with (credentials, endpoint): another process opens the same store with it."""
        self._root = (os.path.abspath(self.url.removeprefix("file://")) if self.protocol == "file"
                      else self.fs._strip_protocol(self.url)).rstrip("/")
        self._real_root = os.path.realpath(self._root) if self.protocol == "file" else self._root
        self._real_folders: dict[str, str] = {}
        """Local folder -> its real path: resolved once, not once per object read (folders are create-only too)."""
        self._reported: set[str] = set()
        self._create_lock = threading.Lock()
        self.retries = 0
        """Transient errors retried so far (a metric: faults the store absorbed)."""

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @functools.cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem, opened (and fsspec imported, megabytes) on first use: a local store reads, lists,
        creates and stats objects itself, so a process that only reads a local campaign never pays for it."""
        import fsspec

        return fsspec.filesystem(self.protocol, **self.storage_options)

    def other(self, url: str) -> Store:
        """A store at another URL with this one's budgets; on the same backend also its options (credentials,
        endpoint), as when a campaign starts from another campaign's weights."""
        same = normalize_url(url).split("://", 1)[0] == self.protocol
        return Store(url, retry=self.retry, storage_options=self.storage_options if same else None,
                     external_deadline_s=self.external_deadline_s, sleep=self._sleep)

    def call_external(self, op: str, rel: str, fn: Callable[[], T]) -> T:
        """``fn()`` (another client's call on ``rel``, e.g. an Orbax save) within ``external_deadline_s``."""
        return call_with_deadline(op, self.uri(rel), fn, self.external_deadline_s)

    # -- paths -------------------------------------------------------------------------------------------
    def uri(self, rel: str = "") -> str:
        """Full URL of ``rel`` (what external tools such as Orbax or pyarrow are given)."""
        return f"{self.url}/{rel}".rstrip("/") if rel else self.url

    def local_path(self, rel: str = "") -> Path | None:
        """Filesystem path for local campaigns, ``None`` elsewhere."""
        return Path(self._path(rel)) if self.protocol == "file" else None

    def holder(self, rel: str) -> Store:
        """The store whose own folder holds ``rel``: this one (a fork's view answers with the folder it resolves
        ``rel`` to), for a reader that opens the object with another client (pyarrow)."""
        return self

    def object_path(self, rel: str) -> str:
        """``rel`` as a path of this store's filesystem (``fs`` for a bucket; a local path for a local store)."""
        return self._path(rel)

    def _path(self, rel: str) -> str:
        rel = rel.strip("/")
        if ".." in rel.split("/"):
            raise ValueError(f"relative storage path may not contain '..': {rel!r}")
        return f"{self._root}/{rel}" if rel else self._root

    # -- retries -----------------------------------------------------------------------------------------
    def _call(self, op: str, rel: str, fn: Callable[[], T]) -> T:
        start = time.monotonic()
        delay = self.retry.base_delay_s
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return fn()
            except FileExistsError as e:
                raise AlreadyExistsError(op, self.uri(rel), "object exists already (create-only)") from e
            except FileNotFoundError as e:
                raise NotFoundError(op, self.uri(rel), "no such object") from e
            except StorageError:
                raise
            except Exception as e:  # noqa: BLE001 - classified right here, re-raised with context
                elapsed = time.monotonic() - start
                if not is_transient(e) or attempt == self.retry.attempts or elapsed >= self.retry.deadline_s:
                    detail = f"{type(e).__name__}: {e}"
                    if is_transient(e):
                        detail += f" (gave up after {attempt} tries in {elapsed:.1f}s)"
                    raise StorageError(op, self.uri(rel), detail) from e
                self.retries += 1
                # One line per retry: a storage fault the pipeline absorbed stays visible in the stage's log.
                _log.warning("storage retry %s %s: %s: %s (try %d of %d)", op, self.uri(rel), type(e).__name__,
                             str(e)[:200], attempt, self.retry.attempts)
                self._sleep(jitter(min(delay, self.retry.max_delay_s)))
                delay *= 2
        raise AssertionError("unreachable")

    # -- objects -----------------------------------------------------------------------------------------
    def create(self, rel: str, data: bytes) -> None:
        """Create ``rel`` with ``data`` only if it does not exist; ``AlreadyExistsError`` otherwise."""
        path = self._path(rel)
        try:
            self._call("create", rel, lambda: self._create(path, data))
        except AlreadyExistsError:
            # A retried upload whose first attempt committed but lost its reply finds its own bytes: that is
            # success. Anything else there is a real conflict.
            if self._call("read", rel, lambda: self.fs.cat_file(path)) != data:
                raise

    def _create(self, path: str, data: bytes) -> None:
        if self.protocol == "file":
            folder, name = os.path.split(path)
            os.makedirs(folder, exist_ok=True)
            tmp = os.path.join(folder, f".{name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        elif self.protocol in ("gs", "gcs"):
            self.fs.pipe_file(path, data, mode="create")
        else:
            # In-process backends (memory://): a lock makes exists+write one step.
            with self._create_lock:
                if self.fs.exists(path):
                    raise FileExistsError(path)
                self.fs.pipe_file(path, data)

    def create_json(self, rel: str, obj: Any) -> None:
        self.create(rel, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def read(self, rel: str, *, max_bytes: int | None = None) -> bytes:
        """The object's bytes; over ``max_bytes``, a ``TooLargeError`` raised on its size, before it is read (a
        remote object's size costs a metadata request: a range read of an empty object is refused, HTTP 416)."""
        path = self._path(rel)
        if self.protocol == "file":
            return self._call("read", rel, lambda: self._read_local(rel, path, max_bytes))
        if max_bytes is not None and (size := self.size(rel)) > max_bytes:  # create-only: it stays this size
            raise TooLargeError("read", self.uri(rel), f"{size} bytes, over the {max_bytes} its reader accepts")
        return self._call("read", rel, lambda: self.fs.cat_file(path))

    def _read_local(self, rel: str, path: str, max_bytes: int | None) -> bytes:
        folder, _, name = path.rpartition("/")
        real_folder = self._real_folders.get(folder)
        if real_folder is None:
            real_folder = self._real_folders[folder] = os.path.realpath(folder)
        real = os.path.join(real_folder, name)
        # lstat before open: opening a FIFO blocks until a writer appears, and opening a device may act on it.
        # (Objects are create-only, so nothing legitimate swaps a file between this check and the read.)
        mode = os.lstat(real).st_mode
        if stat.S_ISLNK(mode):
            real = os.path.realpath(real)
            try:
                mode = os.stat(real).st_mode
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                raise NotAnObjectError("read", self.uri(rel), "a symlink loop (it never reaches a file)") from e
        if real != self._real_root and not real.startswith(self._real_root + os.sep):
            raise NotAnObjectError("read", self.uri(rel), f"a symlink leading outside the campaign (to {real})")
        if not stat.S_ISREG(mode):
            raise NotAnObjectError("read", self.uri(rel), f"not a regular file ({_file_kind(mode)})")
        with open(real, "rb") as f:
            if max_bytes is not None and (size := os.fstat(f.fileno()).st_size) > max_bytes:  # a sparse file too
                raise TooLargeError("read", self.uri(rel), f"{size} bytes, over the {max_bytes} its reader accepts")
            return f.read()

    def read_json(self, rel: str) -> Any:
        data = self.read(rel, max_bytes=MAX_JSON_BYTES)
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deeply
            raise StorageError("read", self.uri(rel), f"not valid JSON: {json_problem(e)}") from e

    def exists(self, rel: str) -> bool:
        path = self._path(rel)
        if self.protocol == "file":
            return self._call("exists", rel, lambda: os.path.exists(path))
        return self._call("exists", rel, lambda: self.fs.exists(path))

    def size(self, rel: str) -> int:
        path = self._path(rel)
        return int(self._call("info", rel, lambda: self.fs.info(path))["size"])

    def list(self, rel: str, *, include_hidden: bool = False) -> list[str]:
        """Sorted names directly under folder ``rel`` (objects and sub-folders). Missing folder → []."""
        path = self._path(rel)

        def ls() -> list[str]:
            if self.protocol == "file":  # fsspec's local ls stats every entry: far slower on a large folder
                try:
                    return os.listdir(path)
                except (FileNotFoundError, NotADirectoryError):
                    return []
            try:
                entries = self.fs.ls(path, detail=False, refresh=True)
            except FileNotFoundError:
                return []
            return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != path]

        names = self._call("list", rel, ls)
        if not include_hidden:
            names = [n for n in names if not n.startswith(".")]
        return sorted(set(names))

    def list_if_changed(self, rel: str, since: int | None) -> tuple[list[str] | None, int | None]:
        """``(list(rel), token)``, or ``(None, since)`` when folder ``rel`` has not changed since the listing that
        returned the token ``since``. Only a local folder gives tokens (its modification time, which every create
        moves); elsewhere the token is None and every call lists.

        A token is handed out only once the folder has been still for ``SETTLED_S``: a file system stamps times
        at a coarse tick, and a create in the tick of the previous change would leave the time as it was."""
        if self.protocol != "file":
            return self.list(rel), None
        try:
            mtime_ns = self._call("stat", rel, lambda: os.stat(self._path(rel))).st_mtime_ns
        except NotFoundError:
            return [], None
        if since is not None and mtime_ns == since:
            return None, since
        token = mtime_ns if time.time_ns() - mtime_ns > SETTLED_S * 1e9 else None
        return self.list(rel), token

    def walk(self, rel: str = "", *, skip: Callable[[str], bool] | None = None) -> list[str]:
        """Every object under ``rel`` (hidden ones included), as paths relative to the campaign root; folders
        ``skip`` accepts (given relative to the root) are left out, so a reader can list a large folder piece by
        piece instead of holding it whole."""
        path = self._path(rel)
        prefix = self._root + "/"

        def skipped(folder: str) -> bool:
            return skip is not None and skip(folder[len(prefix):])

        def find() -> list[str]:
            if self.protocol == "file":
                # A symlinked folder is listed as an object, never entered: it may lead anywhere on the machine.
                out = []
                for folder, dirs, files in os.walk(path, onerror=raise_unless_gone):
                    links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
                    out += [os.path.join(folder, n) for n in files + links]
                    dirs[:] = [d for d in dirs if not skipped(os.path.join(folder, d))]
                return out
            try:
                self.fs.invalidate_cache()
                found = self.fs.find(path)
            except FileNotFoundError:
                return []
            if skip is None:
                return found
            return [p for p in found if not _under_skipped(p.removeprefix(prefix), skip)]

        return sorted(p[len(prefix):] if p.startswith(prefix) else p for p in self._call("walk", rel, find))

    def delete(self, rel: str) -> None:
        """Remove one object. Only used to clean up temporaries and in tests: commits are never deleted."""
        path = self._path(rel)
        self._call("delete", rel, lambda: self.fs.rm_file(path))

    # -- pointers ----------------------------------------------------------------------------------------
    def advance_pointer(self, rel: str, payload: dict[str, Any], *, key: str = "version") -> bool:
        """Move pointer ``rel`` forward to ``payload`` (ordered by integer ``payload[key]``).

        Returns False (and changes nothing visible) when the pointer is already at or past that value.
        """
        value = int(payload[key])
        if value < 0:
            raise ValueError(f"pointer {rel}: {key} must be >= 0, got {value}")
        try:
            self.create_json(self.pointer_entry(rel, value), payload)
        except AlreadyExistsError:
            return False
        current = self.read_pointer(rel, key=key)
        if current is not None and int(current[key]) > value:
            return False
        self._write_mirror(rel, current or payload)
        return True

    def read_pointer(self, rel: str, *, key: str = "version") -> dict[str, Any] | None:
        """The pointer's current payload (the largest valid entry), or None if it was never set.

        Entries are tried from the largest name down and the first whose name and content agree wins, so
        the usual cost is one listing and one read; invalid entries are skipped with a warning.
        """
        names = self.list(f"{rel}.d")
        for name in names:
            if parse_pointer_entry(name) is None:
                self._report(f"{rel}.d/{name}", "not a pointer entry name (<value:012d>.json)")
        for name in sorted((n for n in names if parse_pointer_entry(n) is not None), reverse=True):
            entry = f"{rel}.d/{name}"
            try:
                payload: Any = self.read_json(entry)
            except (NotFoundError, NotAnObjectError, TooLargeError) as e:
                self._report(entry, str(e))
                continue
            except StorageError as e:
                if isinstance(e.__cause__, ValueError | RecursionError):  # not JSON (nested too deeply, say)
                    self._report(entry, str(e))
                    continue
                raise
            problem = pointer_entry_problem(name, payload, key=key)
            if problem is None:
                return payload
            self._report(entry, problem)
        return None

    def _report(self, rel: str, problem: str) -> None:
        if rel not in self._reported:
            self._reported.add(rel)
            _log.warning("skipping pointer entry %s: %s", self.uri(rel), problem)

    def pointer_keys(self, rel: str) -> list[int]:
        """Every value pointer ``rel`` has been advanced to (by entry name; ``read_pointer`` also checks the
        content), ascending."""
        return sorted(v for n in self.list(f"{rel}.d") if (v := parse_pointer_entry(n)) is not None)

    @staticmethod
    def pointer_entry(rel: str, value: int) -> str:
        """The object that recorded pointer ``rel`` moving to ``value``."""
        return f"{rel}.d/{value:012d}.json"

    def _write_mirror(self, rel: str, payload: dict[str, Any]) -> None:
        data = (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode()
        path = self._path(rel)
        if self.protocol == "file":
            tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}{TEMP_MARKER}{uuid.uuid4().hex[:12]}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            self._call("write_pointer", rel, lambda: self.fs.pipe_file(path, data))


def _under_skipped(rel: str, skip: Callable[[str], bool]) -> bool:
    """Whether a folder holding ``rel`` (relative to the root) is one ``skip`` accepts."""
    parts = rel.split("/")
    return any(skip("/".join(parts[:k])) for k in range(1, len(parts)))


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a plain file"
