"""Shard verdicts kept between SQL queries: a repeat query over an unchanged campaign decodes only new shards.

``audit.sql`` decodes and validates every shard before it lets DuckDB scan the files. A shard is create-only, so
once judged valid the same file stays valid; what is kept is that judgement, per shard, for the next query::

    kept = load_verdicts(folder, campaign_url)           shard path -> identity it was judged valid with
    identity(store, path) == kept.get(path)              -> reuse the verdict, skip the decode
    save_verdicts(folder, campaign_url, valid)           the shards judged valid now (replaces the file)

Why a kept verdict cannot be forged into hiding damage:

- **Where it is kept.** In the querying user's own cache folder (``Settings.cache``, ``sql-verdicts/``), never in
  the campaign folder: whoever can write into a campaign (a worker, a tool, someone holding its bucket's
  credentials) cannot write a verdict. A file there that another user owns, or that others may write, is not read
  (every shard is checked); the folder is created private (0700).
- **What it is keyed by.** A local shard's (device, inode, size, mtime, ctime) read with ``lstat``. Any write to
  the file, a rename over it or a new file under its name changes the inode or the ctime, which the kernel sets
  to its own clock on every change and no system call sets to a chosen value (``touch`` and ``utime`` reset
  mtime, and that moves ctime again). A rewritten shard therefore no longer matches its verdict and is checked
  again, exactly like a new one. The kernel's file clock is coarse (a few ms), so a file changed within
  ``SETTLED_S`` of the check gets no verdict (a second change in the same tick would keep its ctime), as
  ``Store.list_if_changed`` trusts a folder's mtime. Only regular files get a verdict: a symlink's target can
  change under an unchanged link. On a bucket there is no such identity here, so every shard there is checked each time.
- **Which checker gave it.** Verdicts carry a digest of the checker's source (``pipelines_lib/trajectory/``) and
  the pyarrow version; a changed or stricter check re-judges every shard.
- **Only valid verdicts are kept.** A shard that did not read or validate is checked again on every query (and
  reported again), so a kept file can only spare work, never add a finding or drop one on a changed shard.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import time
import uuid
from pathlib import Path

import pyarrow as pa

from pipelines_lib.storage.store import SETTLED_S, Store

_CHECKER = Path(__file__).resolve().parents[1] / "trajectory"
Identity = list[int]


@functools.cache
def checker_digest() -> str:
    """Digest of the code that decides a shard's verdict: the trajectory package's sources and pyarrow's version."""
    h = hashlib.sha256(pa.__version__.encode())
    for source in sorted(_CHECKER.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()


def identity(holder: Store, path: str) -> Identity | None:
    """(device, inode, size, mtime ns, ctime ns) of the regular local file holding shard ``path`` in ``holder``
    (the store whose own folder holds it, ``Store.holder``); None on a bucket, for anything but a regular file, or
    for a file changed less than ``SETTLED_S`` ago (see the module docstring)."""
    if holder.protocol != "file":
        return None
    try:
        st = os.lstat(holder.object_path(path))
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or time.time_ns() - st.st_ctime_ns < SETTLED_S * 1e9:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _file(folder: Path, campaign: str) -> Path:
    return folder / f"{hashlib.sha256(campaign.encode()).hexdigest()[:32]}.json"


def _trusted(path: Path) -> bool:
    """The file is this user's own and nobody else may write it."""
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def load_verdicts(folder: Path, campaign: str) -> dict[str, Identity]:
    """Shard path -> the identity it was judged valid with, for ``campaign`` by this checker; empty when there is
    no such file, it is not trusted (``_trusted``) or does not parse."""
    path = _file(folder, campaign)
    try:
        if not _trusted(path):
            return {}
        kept = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("checker") != checker_digest() or kept.get("campaign") != campaign:
        return {}
    shards = kept.get("shards")
    return {p: i for p, i in shards.items() if isinstance(i, list)} if isinstance(shards, dict) else {}


def save_verdicts(folder: Path, campaign: str, valid: dict[str, Identity]) -> None:
    """Keep ``valid`` (shard path -> identity) as the verdicts of ``campaign``: a private temporary renamed over
    the previous file, so a reader sees the old verdicts or the new ones."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = folder / f".{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"checker": checker_digest(), "campaign": campaign, "shards": valid}, f)
    os.replace(tmp, _file(folder, campaign))


__all__ = ["checker_digest", "identity", "load_verdicts", "save_verdicts"]
