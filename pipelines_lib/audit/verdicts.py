"""Shard verdicts kept between SQL queries, with the rows they vouch for: a repeat query over an unchanged campaign
decodes no shard and opens no shard file.

``audit.sql`` decodes and validates every shard before DuckDB scans its rows. A shard is create-only, so once judged
valid the same file stays valid and holds the same rows; what is kept, per campaign, is that judgement together with
the decoded rows, in segments (Arrow IPC files of ``TRAJECTORIES_SCHEMA`` rows) named by one index file::

    segments = load_segments(folder, campaign_url, schema)    each: shard -> identity it was judged valid with, rows
    plan = plan_reuse(segments, ids, max_segments=...)        the segments still whole, the rows to carry over, the
                                                              shards to check
    with SegmentWriter(folder, campaign_url, schema) as w:     the rows of the shards judged valid now
        w.carry(plan.carried); w.add(shard, identity, rows)
        new = w.commit(plan.whole)                             the index now names plan.whole and the new segment

A query then scans the segments' rows (memory-mapped, one file each) instead of thousands of shard files. A segment
is reused whole only while every shard it holds still has the identity it was judged with; otherwise the rows of its
unchanged shards are carried into the next segment and the rest is checked again. Each write adds one segment, and
once ``max_segments`` are kept they are merged into the next one, so a query scans a bounded number of files.

Why a kept verdict (or a kept row) cannot be forged into hiding damage:

- **Where it is kept.** In the querying user's own cache folder (``Settings.cache``, ``sql-verdicts/``), never in
  the campaign folder: whoever can write into a campaign (a worker, a tool, someone holding its bucket's
  credentials) cannot write a verdict or a kept row. An index or segment there that another user owns, or that
  others may write, is not read (its shards are checked); the folder is created private (0700). The rows scanned
  for a kept shard are the rows decoded when it was judged, so a shard file changed after its check cannot slip
  unchecked rows into a query either.
- **What it is keyed by.** A local shard's (device, inode, size, mtime, ctime) read with ``lstat``. Any write to
  the file, a rename over it or a new file under its name changes the inode or the ctime, which the kernel sets
  to its own clock on every change and no system call sets to a chosen value (``touch`` and ``utime`` reset
  mtime, and that moves ctime again). A rewritten shard therefore no longer matches its verdict and is checked
  again, exactly like a new one. The kernel's file clock is coarse (a few ms), so a file changed within
  ``SETTLED_S`` of the check gets no verdict (a second change in the same tick would keep its ctime), as
  ``Store.list_if_changed`` trusts a folder's mtime. Only regular files get a verdict: a symlink's target can
  change under an unchanged link. On a bucket there is no such identity here, so every shard there is checked
  each time (and scanned from its object).
- **Which checker gave it.** The index carries a digest of the checker's source (``pipelines_lib/trajectory/``)
  and the pyarrow version, and a segment must hold exactly the schema asked for; a changed or stricter check
  re-judges every shard.
- **Only valid verdicts are kept.** A shard that did not read or validate is checked again on every query (and
  reported again), so kept files can only spare work, never add a finding or drop one on a changed shard.

Two queries at once each write their own segment and replace the index whole (a reader sees the old index or the
new one); a segment the last index does not name is removed by the next write, so at worst a shard is checked
again. A segment that has gone by the time it is opened counts as not kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc

from pipelines_lib.storage.store import SETTLED_S, Store

_CHECKER = Path(__file__).resolve().parents[1] / "trajectory"
Identity = list[int]
SEGMENT_BATCH_ROWS = 4096
"""Rows a segment's record batches hold (at most about): a scan's cost grows with the number of batches, a writer's
memory with their size."""


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


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One kept file: the rows of the shards it names, each judged valid with the identity it maps to."""

    name: str
    shards: dict[str, Identity]
    rows: pa.Table
    """Memory-mapped: a query reads the pages of the columns it names."""


@dataclass(frozen=True, kw_only=True)
class Reuse:
    """What ``plan_reuse`` decided for one query."""

    whole: list[Segment]
    """Segments scanned as they are: every shard they hold is unchanged."""
    carried: dict[str, Segment]
    """Unchanged shard -> the segment its rows are copied from into the next one."""
    changed: bool
    """Whether the kept files no longer match what is kept: a segment is dropped or merged, or a shard with an
    identity is to be checked (and kept if valid)."""


def plan_reuse(segments: list[Segment], ids: dict[str, Identity | None], *, max_segments: int) -> Reuse:
    """Which kept rows serve the campaign whose shards have identities ``ids`` (a shard absent from ``ids`` is gone).
    A segment is reused whole when each of its shards still has its identity and no earlier segment holds it; the
    unchanged shards of the others are carried. If anything is to be written and ``max_segments`` segments would be
    reused whole, they are carried too: the next segment merges them."""
    whole: list[Segment] = []
    held: set[str] = set()
    for segment in segments:
        if held.isdisjoint(segment.shards) and all(ids.get(p) == i for p, i in segment.shards.items()):
            whole.append(segment)
            held.update(segment.shards)
    carried: dict[str, Segment] = {}
    for segment in segments:
        if not any(segment is s for s in whole):
            carried |= {p: segment for p, i in segment.shards.items()
                        if ids.get(p) == i and p not in held and p not in carried}
    changed = len(whole) < len(segments) or any(i is not None and p not in held for p, i in ids.items())
    if changed and len(whole) >= max_segments:
        carried |= {p: s for s in whole for p in s.shards}
        whole = []
    return Reuse(whole=whole, carried=carried, changed=changed)


def _index(folder: Path, campaign: str) -> Path:
    return folder / f"{_prefix(campaign)}.json"


def _prefix(campaign: str) -> str:
    return hashlib.sha256(campaign.encode()).hexdigest()[:32]


def _is_segment_name(name: str, campaign: str) -> bool:
    """A name ``SegmentWriter`` gives a segment of ``campaign``: a file of the folder itself."""
    return name.startswith(f"{_prefix(campaign)}-") and name.endswith(".arrow") and "/" not in name


def _trusted(path: Path) -> bool:
    """The file is this user's own and nobody else may write it."""
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _mapped(path: Path) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def _open_rows(path: Path, schema: pa.Schema) -> pa.Table | None:
    """The segment's rows, memory-mapped; None when it is gone, not trusted, not an Arrow file or of another schema."""
    try:
        rows = _mapped(path) if _trusted(path) else None
    except (OSError, pa.ArrowInvalid):
        return None
    return rows if rows is not None and rows.schema.equals(schema) else None


def load_segments(folder: Path, campaign: str, schema: pa.Schema) -> list[Segment]:
    """The segments kept for ``campaign`` by this checker whose files open with ``schema``; empty when there is no
    index, it is not trusted (``_trusted``) or does not parse."""
    path = _index(folder, campaign)
    try:
        if not _trusted(path):
            return []
        kept = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return []
    if not isinstance(kept, dict) or kept.get("checker") != checker_digest() or kept.get("campaign") != campaign \
            or not isinstance(named := kept.get("segments"), dict):
        return []
    out = []
    for name, shards in named.items():
        if isinstance(shards, dict) and _is_segment_name(name, campaign) \
                and (rows := _open_rows(folder / name, schema)) is not None:
            out.append(Segment(name=name, shards={p: i for p, i in shards.items() if isinstance(i, list)}, rows=rows))
    return out


class SegmentWriter:
    """Writes the next segment of ``campaign`` (a private hidden temporary, renamed to its name by ``commit``)
    ``SEGMENT_BATCH_ROWS`` at a time; leaving the ``with`` block without ``commit`` removes the temporary."""

    def __init__(self, folder: Path, campaign: str, schema: pa.Schema) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._folder, self._campaign = folder, campaign
        self._name = f"{_prefix(campaign)}-{uuid.uuid4().hex}.arrow"
        self._tmp = folder / f".{self._name}.tmp"
        self._file = os.fdopen(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
        self._writer = pa.ipc.new_file(self._file, schema)
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self.shards: dict[str, Identity] = {}

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def add(self, shard: str, ident: Identity, rows: pa.Table) -> None:
        """Keep ``rows`` (of ``schema``) as shard ``shard``'s, judged valid with identity ``ident``."""
        self.shards[shard] = ident
        self._append(rows)

    def carry(self, carried: dict[str, Segment]) -> None:
        """Copy the rows of each shard of ``carried`` from the segment it maps to (``Reuse.carried``)."""
        for segment in {id(s): s for s in carried.values()}.values():
            shards = [p for p, s in carried.items() if s is segment]
            self.shards |= {p: segment.shards[p] for p in shards}
            keep = pa.array(shards, pa.string())
            for batch in segment.rows.to_batches():
                self._append(pa.Table.from_batches([batch.filter(pc.is_in(batch.column("shard"), value_set=keep))]))

    def _append(self, rows: pa.Table) -> None:
        self._buffer.append(rows)
        self._buffered += rows.num_rows
        if self._buffered >= SEGMENT_BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._buffered:
            self._writer.write_table(pa.concat_tables(self._buffer).combine_chunks())
        self._buffer, self._buffered = [], 0

    def commit(self, whole: list[Segment]) -> Segment | None:
        """Finish the segment (none if it holds no shard) and make the index name ``whole`` and it; then remove the
        campaign's segments the index does not name. Returns the new segment, memory-mapped."""
        self._flush()
        self._writer.close()
        self._file.close()
        new = None
        if self.shards:
            os.replace(self._tmp, self._folder / self._name)
            new = Segment(name=self._name, shards=self.shards, rows=_mapped(self._folder / self._name))
        named = {s.name: s.shards for s in [*whole, *([new] if new else [])]}
        tmp = self._folder / f".{uuid.uuid4().hex}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump({"checker": checker_digest(), "campaign": self._campaign, "segments": named}, f)
        os.replace(tmp, _index(self._folder, self._campaign))
        for old in self._folder.glob(f"{_prefix(self._campaign)}-*.arrow"):
            if old.name not in named:
                old.unlink(missing_ok=True)
        return new


__all__ = ["Reuse", "Segment", "SegmentWriter", "checker_digest", "identity", "load_segments", "plan_reuse"]
