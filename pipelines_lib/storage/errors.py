"""Storage errors. Every message names the URL and the operation that failed."""

from __future__ import annotations


class StorageError(OSError):
    """A storage operation failed permanently (or ran out of retries)."""

    def __init__(self, op: str, url: str, detail: str) -> None:
        super().__init__(f"storage {op} {url}: {detail}")
        self.op = op
        self.url = url
        self.detail = detail

    def __reduce__(self) -> tuple[type[StorageError], tuple[str, str, str]]:
        # Pickled by its own arguments: the default rebuilds it from the one message, which ``__init__`` does not
        # take, so a worker process's error would break its pool instead of reaching the caller.
        return type(self), (self.op, self.url, self.detail)


class AlreadyExistsError(StorageError, FileExistsError):
    """A create-only commit lost: the object exists already (someone else wrote it first)."""


class NotFoundError(StorageError, FileNotFoundError):
    """The object does not exist."""


class NotAnObjectError(StorageError):
    """The name exists but is nothing a campaign holds: a FIFO, device, socket or folder, or a symlink leading
    outside the campaign folder. Never retried; readers skip it with this reason and audits report it."""


class TooLargeError(NotAnObjectError):
    """The object is larger than its reader accepts (``Store.read``'s ``max_bytes``): refused on its size, before
    its bytes are read. Readers skip it like any object that is nothing a campaign holds."""


MAX_JSON_BYTES = 64 << 20
"""Largest metadata object (a record, a pointer entry) a reader loads: a campaign writes kilobytes, and a
multi-gigabyte (or sparse) ``campaign.json`` must not cost its reader that much memory."""


def json_problem(e: ValueError | RecursionError) -> str:
    """What ``json.loads`` refused, in words: a document nested too deeply (``[[[...]]]`` 100,000 deep) raises
    ``RecursionError``, whose own message is about the interpreter's stack; readers of campaign objects catch it
    with ``ValueError`` and report this."""
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)


def raise_unless_gone(e: OSError) -> None:
    """A local walk's ``onerror``: a folder it cannot list (refused, a name too long) is an error naming it, never a
    silent hole in the listing; one that is gone (a missing root, a writer's temporary folder) holds nothing."""
    if not isinstance(e, FileNotFoundError | NotADirectoryError):
        raise e
