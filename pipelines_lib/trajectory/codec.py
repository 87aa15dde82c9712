"""Trajectory shards: whole GRPO groups in one compressed Arrow IPC file, committed create-only.

``encode_shard``/``decode_shard`` are the only code that turns tables into bytes and back; ``writer.ShardWriter``
commits what ``encode_shard`` makes, ``reader.ShardTailer`` and the audit read through ``decode_shard``.

Reads are bounded: before a shard is decoded, ``declared_sizes`` reads the sizes its Arrow IPC metadata
declares (rows, and the decoded length of every buffer: a compressed buffer starts with it) without
decompressing anything, and ``decode_shard`` refuses a shard that would decode to more than
``MAX_DECODED_BYTES``, or (when the reader knows its longest usable row) to more than ``row_budget`` bytes a
row. A 1 MB file of LZ4-compressed zeros declaring a 20 M-token row (260 MB decoded) is refused before it costs
memory.

``identity_problem`` ties a shard's content to its name: the writer's provenance (worker, seq, version) must
name the file it is in, so a copy under another name or in another version folder is recognised as one.
"""

from __future__ import annotations

import io
import itertools
import json
import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.record import table_group_versions
from pipelines_lib.trajectory.schema import CAMPAIGN_KEY, MINOR_ADDITIONS, TRAJECTORY_SCHEMA, check_schema
from pipelines_lib.trajectory.validate import Violation, validate_table, validate_tables

SHARD_META_KEY = b"rollstream.shard"
COMPRESSION = "lz4"
"""Arrow IPC body compression of new shards (LZ4 frame). Arrow compresses every buffer of a record batch on its
own, ~100 buffers a shard whatever its size, and its zstd codec sets up a decompression context per buffer: ~7 us
each, 10x the whole LZ4 decode of a small shard. LZ4 files are ~1.3x larger than zstd ones. Readers decode any
codec Arrow supports, so shards written with zstd still read."""
MAX_DECODED_BYTES = 256 * 2**20
"""Largest decoded size of one shard any reader accepts (writers commit at ~32 MiB estimated)."""
TOKEN_BYTES = 13
"""Decoded bytes per token over the four token columns (int32 id, int8 mask, float32 logprob, int32 version)."""
TRAJECTORY_SCHEMA_NAMES = TRAJECTORY_SCHEMA.names
"""Column names a decoded shard ends with, built once (``Schema.names`` builds a new list on every call)."""
THREADED_DECODE_BYTES = 2**20
"""Shards larger than this (in the file) are decompressed on Arrow's thread pool."""
ROW_OVERHEAD_BYTES = 64 * 2**10
"""Allowance per row for everything but tokens (ids, turns, tool errors, timings, offsets)."""


def row_budget(max_row_tokens: int) -> int:
    """Decoded bytes a row of at most ``max_row_tokens`` tokens may take."""
    return max_row_tokens * TOKEN_BYTES + ROW_OVERHEAD_BYTES


class ShardError(ValueError):
    """A shard could not be read or failed validation; the message names the shard."""


DERIVED_COLUMNS = {"version": table_group_versions,
                   "status_reason": lambda table: pa.nulls(table.num_rows, pa.string())}
"""How a reader fills each column of ``MINOR_ADDITIONS`` that a shard of an older minor lacks."""


def encode_shard(table: pa.Table, provenance: dict, *, campaign: str | None = None) -> bytes:
    """IPC bytes of ``table`` with ``provenance`` (and the campaign id, when given) in the schema metadata."""
    meta = dict(table.schema.metadata or {})
    meta[SHARD_META_KEY] = json.dumps(provenance, sort_keys=True).encode()
    if campaign is not None:
        meta[CAMPAIGN_KEY] = campaign.encode()
    table = table.replace_schema_metadata(meta)
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _table_at(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(table position, vtable position, vtable size) of the flatbuffer table at ``pos``."""
    vtable = pos - struct.unpack_from("<i", buf, pos)[0]
    return pos, vtable, struct.unpack_from("<H", buf, vtable)[0]


def _field(buf: bytes, table: tuple[int, int, int], index: int) -> int | None:
    """Absolute position of field ``index`` of a flatbuffer table, or None when absent."""
    pos, vtable, vsize = table
    if 4 + 2 * index + 2 > vsize:
        return None
    off = struct.unpack_from("<H", buf, vtable + 4 + 2 * index)[0]
    return pos + off if off else None


def _deref(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


def _vector(buf: bytes, table: tuple[int, int, int], index: int, size: int) -> tuple[int, int]:
    """(position, length) of a vector of ``size``-byte structs stored in field ``index``; (0, 0) when absent."""
    at = _field(buf, table, index)
    if at is None:
        return 0, 0
    vec = _deref(buf, at)
    n = struct.unpack_from("<I", buf, vec)[0]
    if vec + 4 + n * size > len(buf):
        raise ValueError(f"vector of {n} entries runs past the end of its buffer")
    return vec + 4, n


def _structs(buf: bytes, table: tuple[int, int, int], index: int, fmt: str) -> list[tuple]:
    """A vector of fixed-size structs (``fmt``) stored in field ``index``; [] when absent."""
    size = struct.calcsize(fmt)
    start, n = _vector(buf, table, index, size)
    return [struct.unpack_from(fmt, buf, start + i * size) for i in range(n)]


def _batch_buffers(data: bytes) -> tuple[int, list[tuple[int, int, np.ndarray, bool]]]:
    """(rows, per record batch ``(body position, body length, buffers as (offset, length) rows, compressed)``) an
    Arrow IPC file declares in its footer and record-batch headers; ``ValueError`` on malformed metadata."""
    try:
        if len(data) < 18 or data[:6] != b"ARROW1" or data[-6:] != b"ARROW1":
            raise ValueError("no Arrow IPC file magic")
        footer_len = struct.unpack_from("<i", data, len(data) - 10)[0]
        if not 0 < footer_len <= len(data) - 18:
            raise ValueError(f"footer length {footer_len} out of range")
        footer = data[len(data) - 10 - footer_len:len(data) - 10]
        blocks = _structs(footer, _table_at(footer, _deref(footer, 0)), 3, "<qi4xq")
        rows = 0
        batches = []
        for offset, meta_len, body_len in blocks:
            if offset < 0 or meta_len < 8 or body_len < 0 or offset + meta_len + body_len > len(data):
                raise ValueError(f"record batch block ({offset}, {meta_len}, {body_len}) outside the file")
            start = offset + 8 if struct.unpack_from("<i", data, offset)[0] == -1 else offset + 4
            message = data[start:offset + meta_len]
            msg = _table_at(message, _deref(message, 0))
            header_at = _field(message, msg, 2)
            if header_at is None:
                raise ValueError("record batch message without a header")
            batch = _table_at(message, _deref(message, header_at))
            length_at = _field(message, batch, 0)
            rows += struct.unpack_from("<q", message, length_at)[0] if length_at is not None else 0
            start, n = _vector(message, batch, 2, 16)
            buffers = np.frombuffer(message, "<i8", count=2 * n, offset=start).reshape(-1, 2)
            batches.append((offset + meta_len, body_len, buffers, _field(message, batch, 3) is not None))
        return rows, batches
    except (struct.error, IndexError) as e:
        raise ValueError(f"malformed Arrow IPC metadata ({e})") from e


def declared_sizes(data: bytes) -> tuple[int, int]:
    """(rows, decoded bytes) an Arrow IPC file declares, read from its footer and record-batch headers only.

    The IPC format (Arrow's ``File.fbs``/``Message.fbs``): a footer flatbuffer lists record-batch blocks
    ``(offset, metadata length, body length)``; each block's ``RecordBatch`` header gives its row count and
    its buffers ``(offset, length)`` inside the body, and with body compression every non-empty buffer
    starts with its decoded length as an int64 (-1: stored uncompressed). Raises ``ValueError`` on a
    malformed file.
    """
    rows, batches = _batch_buffers(data)
    decoded = 0
    for body, body_len, buffers, compressed in batches:
        # The buffers as one array: a shard has ~100 of them, and this runs before every decode.
        buf_offset, buf_len = buffers[:, 0], buffers[:, 1]
        outside = (buf_offset < 0) | (buf_len < 0) | (buf_offset > body_len - buf_len)
        if outside.any():
            raise ValueError(f"buffer {tuple(buffers[outside][0].tolist())} outside its record batch body")
        size = buf_len.copy()
        if compressed:
            prefixed = np.flatnonzero(buf_len >= 8)
            at = (body + buf_offset[prefixed])[:, None] + np.arange(8)
            declared = np.frombuffer(data, np.uint8)[at].copy().view("<i8").ravel()
            size[prefixed] = np.where(declared == -1, buf_len[prefixed] - 8, declared)
        if (size < 0).any():
            raise ValueError(f"buffer declares a decoded length of {size[size < 0][0]}")
        decoded += int(size.sum())
    return rows, decoded


_PREFIX = np.arange(8)
"""Byte offsets of a compressed buffer's int64 decoded-length prefix."""


def declared_sizes_of(datas: Sequence[bytes]) -> list[tuple[int, int] | ValueError]:
    """``declared_sizes`` of each of ``datas`` (the error in place of a malformed one), with the buffer checks of
    all of them in one NumPy pass: per shard they cost their call overheads, not their ~100 buffers."""
    parsed: list[tuple[int, list] | ValueError] = []
    for data in datas:
        try:
            parsed.append(_batch_buffers(data))
        except ValueError as e:
            parsed.append(e)
    batches = [(k, *batch) for k, got in enumerate(parsed) if isinstance(got, tuple) for batch in got[1]]
    if not batches:
        return [got if isinstance(got, ValueError) else (got[0], 0) for got in parsed]
    owners, bodies, body_lens, buffers, compressed = zip(*batches, strict=True)
    counts = [len(b) for b in buffers]
    owner_b, body_b, body_len_b, compressed_b = (np.repeat(np.array(v), counts)
                                                 for v in (owners, bodies, body_lens, compressed))
    all_buffers = np.concatenate(buffers)
    buf_offset, buf_len = all_buffers[:, 0], all_buffers[:, 1]
    bad = (buf_offset < 0) | (buf_len < 0) | (buf_offset > body_len_b - buf_len)
    size = np.where(bad, 0, buf_len)
    prefixed = np.flatnonzero(compressed_b & (buf_len >= 8) & ~bad)
    at = body_b[prefixed] + buf_offset[prefixed]
    declared = np.empty(len(prefixed), np.int64)
    bounds = np.searchsorted(owner_b[prefixed], np.arange(len(datas) + 1)).tolist()  # owners ascend
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):  # one gather per shard, in its own bytes
        if hi > lo:
            declared[lo:hi] = np.frombuffer(datas[k], np.uint8)[at[lo:hi, None] + _PREFIX].view("<i8").ravel()
    size[prefixed] = np.where(declared == -1, buf_len[prefixed] - 8, declared)
    bad |= size < 0
    decoded = np.zeros(len(datas), np.int64)
    np.add.at(decoded, owner_b, size)
    flagged = set(owner_b[bad].tolist())
    out: list[tuple[int, int] | ValueError] = []
    for k, got in enumerate(parsed):
        if isinstance(got, ValueError):
            out.append(got)
        elif k in flagged:  # worded by the one-shard path, which stops at the first bad buffer
            try:
                out.append(declared_sizes(datas[k]))
            except ValueError as e:
                out.append(e)
        else:
            out.append((got[0], int(decoded[k])))
    return out


def check_declared_sizes(data: bytes, where: str, *, max_row_tokens: int | None = None) -> None:
    """Refuse (``ShardError``) a shard whose declared decoded size is over the limits, before decoding it."""
    try:
        sizes = declared_sizes(data)
    except ValueError as e:
        sizes = e
    _check_sizes(sizes, where, max_row_tokens)


def _check_sizes(sizes: tuple[int, int] | ValueError, where: str, max_row_tokens: int | None) -> None:
    if isinstance(sizes, ValueError):
        raise ShardError(f"{where}: unreadable Arrow IPC file ({sizes})") from sizes
    rows, decoded = sizes
    if decoded > MAX_DECODED_BYTES:
        raise ShardError(f"{where}: declares {decoded} decoded bytes, over the limit of {MAX_DECODED_BYTES}")
    if max_row_tokens is not None and decoded > max(rows, 1) * row_budget(max_row_tokens):
        raise ShardError(f"{where}: declares {decoded} decoded bytes for {rows} row(s), over "
                         f"{row_budget(max_row_tokens)} a row (rows of at most {max_row_tokens} tokens)")


def identity_problem(path: str, provenance: dict, *, groups: int | None = None) -> str | None:
    """Why a shard's content does not belong under the name ``path`` (None: it does, or nothing says otherwise).

    The writer records ``worker_id``, ``seq``, ``version`` and ``n_groups``; the same bytes under another name or
    version folder are a copy, whose groups are already in the original. ``groups`` is the number of groups the
    reader found in the content: a name that declares another count would make a reader that accounts for the
    shard by its name (``layout.shard_name``) miscount it.
    """
    start = path.rfind(f"{layout.TRAJECTORIES}/")  # ``path`` may be relative or a full URL
    sid = layout.parse_shard_path(path[max(start, 0):])
    if sid is None:
        return None
    if sid.groups is not None and groups is not None and sid.groups != groups:
        return f"its name declares {sid.groups} group(s), it holds {groups}"
    expected = {"worker_id": sid.worker_id, "seq": sid.seq, "version": sid.version}
    if sid.groups is not None:
        expected["n_groups"] = sid.groups
    wrong = {k: provenance[k] for k, v in expected.items() if k in provenance and provenance[k] != v}
    if not wrong:
        return None
    recorded = {**expected, **{k: provenance[k] for k in expected if k in provenance}}
    try:
        original = layout.shard_path(int(recorded["version"]), str(recorded["worker_id"]), int(recorded["seq"]),
                                     None if sid.groups is None else int(recorded["n_groups"]))
    except (TypeError, ValueError):
        original = f"provenance {recorded}"
    return f"content was written as {original}, not as this file (a copy?): {wrong}"


def decode_shard(data: bytes, where: str, *, validate: bool = True,
                 max_row_tokens: int | None = None) -> tuple[pa.Table, dict]:
    """Table and provenance of a shard. Raises ``ShardError`` naming ``where`` for anything wrong.

    Declared sizes are checked first (``check_declared_sizes``; ``max_row_tokens`` is the longest row the
    reader can use).
    """
    check_declared_sizes(data, where, max_row_tokens=max_row_tokens)
    return _decode_sized(data, where, validate=validate)


_READ_OPTIONS = {threaded: pa.ipc.IpcReadOptions(use_threads=threaded) for threaded in (False, True)}
"""Decompressing on Arrow's thread pool pays off for large shards only; for a small one the handoffs cost more CPU
than the decoding (an audit of many small shards runs its own worker processes instead)."""


def _decode_sized(data: bytes, where: str, *, validate: bool) -> tuple[pa.Table, dict]:
    """``decode_shard`` of a shard whose declared sizes passed."""
    try:
        table = pa.ipc.open_file(data, options=_READ_OPTIONS[len(data) > THREADED_DECODE_BYTES]).read_all()
        table.validate(full=True)  # IPC reads do not check offsets or UTF-8; a flipped byte must not escape later
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # ArrowMemoryError: a flipped length byte
        raise ShardError(f"{where}: unreadable Arrow IPC file ({e})") from e
    try:
        check_schema(table.schema, where)
    except ValueError as e:
        raise ShardError(str(e)) from e
    try:
        provenance = json.loads((table.schema.metadata or {}).get(SHARD_META_KEY, b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deeply
        raise ShardError(f"{where}: corrupt {SHARD_META_KEY.decode()} metadata ({e})") from e
    if not isinstance(provenance, dict):
        raise ShardError(f"{where}: {SHARD_META_KEY.decode()} metadata is {type(provenance).__name__}, not an object")
    names = table.schema.names  # each ``.names`` builds the list anew: a small shard notices
    for name in MINOR_ADDITIONS:
        if name not in names:
            table = table.append_column(TRAJECTORY_SCHEMA.field(name), DERIVED_COLUMNS[name](table))
            names = table.schema.names
    if names != TRAJECTORY_SCHEMA_NAMES:  # a newer minor's extra columns, or another order
        table = table.select(TRAJECTORY_SCHEMA.names)
    if not table.schema.equals(TRAJECTORY_SCHEMA):
        # Only declared nullability can differ now. Ours is the contract (``validate`` reports the nulls, naming
        # the row): shards of one schema concatenate, a shard declaring a column nullable does not.
        table = pa.Table.from_arrays(table.columns, schema=TRAJECTORY_SCHEMA.with_metadata(table.schema.metadata))
    if validate and (error := _invalid(where, validate_table(table))) is not None:
        raise error
    return table, provenance


def _invalid(where: str, violations: list[Violation]) -> ShardError | None:
    if not violations:
        return None
    shown = "; ".join(str(v) for v in violations[:3])
    more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
    return ShardError(f"{where}: {len(violations)} invariant violation(s): {shown}{more}")


def decode_shards(shards: Sequence[tuple[bytes, str]], *, max_row_tokens: int | None = None
                  ) -> list[tuple[pa.Table, dict] | ShardError]:
    """``decode_shard`` (validated) of each ``(data, where)``, the error in place of a shard that fails. The
    invariants of the decodable ones are checked together (``validate_tables``): per-call overheads dominate a
    small shard's checks."""
    out: list[tuple[pa.Table, dict] | ShardError] = []
    for (data, where), sizes in zip(shards, declared_sizes_of([data for data, _ in shards]), strict=True):
        try:
            _check_sizes(sizes, where, max_row_tokens)
            out.append(_decode_sized(data, where, validate=False))
        except ShardError as e:
            out.append(e)
    decoded = [(i, d) for i, d in enumerate(out) if not isinstance(d, ShardError)]
    for (i, d), violations in zip(decoded, validate_tables([table for _, (table, _) in decoded]), strict=True):
        out[i] = _invalid(shards[i][1], violations) or d
    return out


def read_shard(store: Store, path: str, *, validate: bool = True,
               max_row_tokens: int | None = None) -> tuple[pa.Table, dict]:
    """Read and check one committed shard (``ShardError`` / ``StorageError`` name it on failure)."""
    return decode_shard(store.read(path), store.uri(path), validate=validate, max_row_tokens=max_row_tokens)
