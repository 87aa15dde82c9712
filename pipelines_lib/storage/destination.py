"""Where an operator's command may write: never into a campaign it reads, never over a file it did not write.

The commands that read a campaign and write elsewhere take the destination from the person typing
(``export C OUT``, ``trace C --out FILE``, ``replay C --dump DIR``, ``fork C NEW``, ``export-weights C OUT``). A
slip of the finger (``--out C/campaign.json``, ``export C C``) must not damage what the command reads::

    refuse_inside(out.url, [campaign, its fork parents...], what="--out")   DestinationError naming both
    write_file(path, data, overwrite=False)                                 create-only; replaced only on request

``refuse_inside`` compares locations, not spellings: local paths through their real paths (a symlink or ``..``
into the campaign is inside it), bucket URLs by bucket and key prefix (``gcs://`` is ``gs://``), on folder
boundaries (``C2`` is not inside ``C``). ``write_file`` creates a local file as the store creates an object (a
hidden temporary linked to the name, so a killed writer leaves no partial file); with ``overwrite`` an existing
file is replaced by a rename of the complete temporary, never truncated in place.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path

from pipelines_lib.storage.store import normalize_url

_ALIASES = {"gcs": "gs"}


class DestinationError(ValueError):
    """A command was pointed at a place it must not write; the message names the place and why."""


def _location(url: str) -> tuple[str, str]:
    """(protocol, path) of ``url`` as a place: a local path resolved through symlinks."""
    protocol, rest = normalize_url(url).split("://", 1)
    if protocol == "file":
        return protocol, os.path.realpath(rest)
    return _ALIASES.get(protocol, protocol), rest.rstrip("/")


def inside(url: str, folder: str) -> bool:
    """Whether ``url`` is the folder ``folder`` or anything below it."""
    (p, path), (q, root) = _location(url), _location(folder)
    return p == q and (path == root or path.startswith(root.rstrip("/") + "/"))


def refuse_inside(url: str, folders: Iterable[str], *, what: str) -> None:
    """Raise ``DestinationError`` when ``url`` (the command's ``what``: ``--out``, the output folder) is inside any
    of ``folders`` (the campaigns the command reads)."""
    for folder in folders:
        if inside(url, folder):
            raise DestinationError(f"{what} {url} is inside the campaign {folder}, which this command reads; "
                                   "write it somewhere outside the campaign folder")


def write_file(path: Path, data: bytes, *, overwrite: bool = False, flag: str = "--overwrite") -> None:
    """Create the local file ``path`` holding ``data``; an existing one is a ``DestinationError`` (naming ``flag``)
    unless ``overwrite``, and then it is replaced whole by a rename."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        if overwrite:
            if path.exists() and not path.is_file():
                raise DestinationError(f"{path}: exists and is not a file; not replaced")
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise DestinationError(f"{path}: already exists; pass {flag} to replace it") from None
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["DestinationError", "inside", "refuse_inside", "write_file"]
