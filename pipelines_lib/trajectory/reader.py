"""Tail committed shards in a version window, hand out whole groups, and resume exactly from a cursor.

The streaming trainer calls ``next_groups(n, Window(version=V, eta=η))`` (``window``: versions ``[V−η, V]``). The tailer lists only the
``trajectories/v…`` folders inside that window (bounded listing), walks their shards in name order (versions
ascending, then worker, then seq: deterministic for a fixed set of shards) and returns up to ``n`` whole
groups, remembering how many rows of a partly consumed shard it has handed out.

Listing is incremental: the tailer remembers what it listed in each live version folder and hands out known
shards first; it lists the window again only when they do not fill a request, and then only names it has not
seen cost anything beyond the listing itself. Emptying a window of S shards is O(S). An idle poll asks each
window folder whether it changed (``Store.list_if_changed``: one ``stat`` of a local folder) and lists only
those that did; on object storage it is one listing per window version. Pending shards are decoded
``DECODE_AHEAD_SHARDS`` at a time, their invariants checked together.

``cursor`` is everything needed to continue, and stays small: per live version and writer, the highest seq
handed out (a writer commits its shards in seq order), plus the rows handed out of a shard not yet finished.
The trainer saves ``TailCursor.to_json()`` in its checkpoints and ``TailCursor.delta_json(before)`` (what one step
changed) in each consumption log; ``before.after(delta)`` rebuilds the cursor, and a tailer built from it hands
out exactly the groups that follow. Read-ahead never leaks into the cursor.

Nothing is skipped silently: an unreadable, foreign or invalid shard becomes a ``TailEvent`` of kind
``skipped`` with the reason; when the window moves past a version, its groups not yet handed out become
``dropped_stale`` events. Moving past a version reads none of its unopened shards: each is dropped whole, its
groups counted from its name (``layout.shard_name``; a shard whose content disagrees with that count is one
readers refuse, and the audit reports it); only a shard with an older name, without the count, is read to
count them. Events are drained by the caller (the trainer writes them into its consumption log), and the
cursor keeps running totals.

Given the trainer's ``TrainerNeeds``, the tailer hands out only groups the trainer can train on; anything
else is skipped with a reason, never raised (a raise would repeat on every restart: a crash loop):

- whole shard: declared sizes over the trainer's row budget (checked before decoding), a FIFO, device or
  symlink out of the campaign (the store refuses it), groups whose rows are interleaved (consumption logs
  and replay address a group by its row range, so such a shard is skipped rather than reassembled: the
  writer never produces one), or content written under another name (``codec.identity_problem``);
- one group: another size than G, a row longer than the trainer takes, token ids outside the vocabulary, a
  reward beyond ``trainable.MAX_ABS_REWARD``, policy versions newer than the trainer's, or a version folder other
  than its oldest policy version;
  or a trajectory whose infrastructure failed (``trainable.infra_problem``): not the policy's doing, so the
  group is kept out of the loss rather than rewarded as a failure.

Duplicates. A group id is handed out at most once, without a set of every consumed id (the cursor must
stay bounded by writers x versions in the window, whatever the campaign's age). Two mechanisms cover the
ways a group can appear twice:

1. Identity ties content to its name. A writer's shard records its worker, seq and version, and each group
   is filed under its oldest policy version; a copied file (another name, or another version folder) fails
   those checks however long ago the original was consumed, and a worker never commits a group twice
   (restarted workers skip the groups they committed, and their names carry a per-start nonce).
2. A window-bounded set: group ids handed out from versions still in the window are remembered in memory
   (pruned as versions retire), so a copy that passes (1) - re-encoded with a forged provenance - is still
   caught while both are in the window. Beyond the window such a copy would be stale and dropped anyway.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipelines_lib.storage import layout
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.channel import GroupSlice
from pipelines_lib.trajectory.codec import (
    ShardError,
    decode_shard,
    decode_shards,
    identity_problem,
    read_shard,
)
from pipelines_lib.trajectory.cursor import TailCursor, TailEvent
from pipelines_lib.trajectory.needs import ShardLimits, limits_of
from pipelines_lib.trajectory.trainable import (
    TrainerNeeds,
    clean_groups,
    group_problem,
    group_runs,
    infra_problem,
)
from pipelines_lib.trajectory.window import Window

DECODE_AHEAD_SHARDS = 64
"""Pending shards of a version decoded and validated together (a small shard's checks cost their overhead)."""
DECODE_AHEAD_BYTES = 16 * 2**20
"""...up to this many bytes of files (large shards are decoded one or a few at a time)."""


def _decode_or_error(data: bytes, where: str, limits: ShardLimits) -> tuple[pa.Table, dict] | ShardError:
    try:
        return decode_shard(data, where, validate=False, limits=limits)
    except ShardError as e:
        return e


def _read_or_error(store: Store, path: str, validate: bool,
                   needs: TrainerNeeds | None) -> tuple[pa.Table, dict] | ShardError | StorageError:
    try:
        return read_shard(store, path, validate=validate, limits=limits_of(needs))
    except (ShardError, StorageError) as e:
        return e


Runs = list[tuple[int, int, str]]
"""A shard's groups as ``(row_start, row_end, group_id)`` (``trainable.group_runs``)."""

class ShardTailer:
    def __init__(self, store: Store, *, cursor: TailCursor | None = None, validate: bool = True,
                 needs: TrainerNeeds | None = None) -> None:
        self.store = store
        self.cursor = cursor or TailCursor()
        self.validate = validate
        self.needs = needs
        """Without it every whole group is handed out (tools that read, not train)."""
        self._tables: dict[str, tuple[pa.Table, Runs]] = {}
        """Shards being handed out: table and its group runs (``group_runs``, computed once per shard)."""
        self._events: list[TailEvent] = []
        self._seen: dict[str, tuple[int, str]] = {}
        """group id -> (version, shard) of groups handed out from versions still in the window."""
        self._listed: dict[int, set[str]] = {}
        """version -> every name listed in its folder so far (live versions only)."""
        self._pending: dict[int, list[layout.ShardId]] = {}
        """version -> shards listed but not yet finished, in name order."""
        self._list_tokens: dict[int, int | None] = {}
        """version -> ``Store.list_if_changed`` token of its folder's last listing (an idle poll lists nothing)."""
        self._decoded: dict[str, tuple[pa.Table, dict, tuple[Runs, str | None]] | ShardError | StorageError] = {}
        """Pending shards decoded ahead of ``_load`` (at most ``DECODE_AHEAD_SHARDS`` of one batch), with their
        group runs."""
        self._clean: dict[str, tuple[int, list[bool]]] = {}
        """Shard -> (newest version, per group: surely trainable with tokens up to it), screened per decoded batch
        (``trainable.clean_groups``): the per-group checks run, for their reason, only on the others."""

    def drain_events(self) -> list[TailEvent]:
        events, self._events = self._events, []
        return events

    def reread(self, shard: str, row_start: int, row_end: int) -> pa.Table:
        """Rows ``[row_start, row_end)`` of ``shard`` read again: a group handed out before (a logged step's)."""
        table, _ = read_shard(self.store, shard, limits=limits_of(self.needs))
        return table.slice(row_start, row_end - row_start)

    def _decode_ahead(self, sid: layout.ShardId, newest: int | None) -> None:
        """Decode ``sid`` and the pending shards after it in its version (up to ``DECODE_AHEAD_SHARDS`` or
        ``DECODE_AHEAD_BYTES`` of files), validated together. What they hold reaches the caller, the events and
        the cursor only when ``_load`` takes each in turn."""
        pending = self._pending[sid.version]
        limits = limits_of(self.needs)
        batch: list[tuple[bytes, str]] = []
        sids: list[layout.ShardId] = []
        size = 0
        for nxt in pending[pending.index(sid):]:
            if len(batch) == DECODE_AHEAD_SHARDS or size >= DECODE_AHEAD_BYTES:
                break
            if nxt.path in self._tables or nxt.path in self._decoded:
                continue
            try:
                data = self.store.read(nxt.path, max_bytes=limits.max_file_bytes)
            except StorageError as e:
                self._decoded[nxt.path] = e
                continue
            batch.append((data, self.store.uri(nxt.path)))
            sids.append(nxt)
            size += len(data)
        decoded = (decode_shards(batch, limits=limits) if self.validate else
                   [_decode_or_error(data, where, limits) for data, where in batch])
        screen = []
        for sid, got in zip(sids, decoded, strict=True):
            if isinstance(got, tuple):
                got = (*got, group_runs(got[0]))
                screen.append((sid, got[0], got[2][0]))
            self._decoded[sid.path] = got
        if self.needs is not None and newest is not None:
            self._screen(screen, newest)

    def _screen(self, tables: list[tuple[layout.ShardId, pa.Table, Runs]], newest: int) -> None:
        """Screen the groups of freshly decoded shards (``(shard, table, group runs)``) together (``_clean``)."""
        if not tables:
            return
        bounds, versions, counts, offset = [], [], [], 0
        for sid, table, runs in tables:
            bounds += [(offset + s, offset + e) for s, e, _ in runs]
            versions += [sid.version] * len(runs)
            counts.append(len(runs))
            offset += table.num_rows
        clean = clean_groups(pa.concat_tables([t for _, t, _ in tables]), np.array(bounds, np.int64).reshape(-1, 2),
                             self.needs, folder_version_g=np.array(versions, np.int64), newest_version=newest,
                             infra=True).tolist()
        for (sid, _, _), start, n in zip(tables, np.cumsum([0, *counts[:-1]]).tolist(), counts, strict=True):
            self._clean[sid.path] = (newest, clean[start:start + n])

    def _load(self, sid: layout.ShardId, newest: int | None = None) -> tuple[pa.Table, Runs] | None:
        """The table of pending shard ``sid`` and its group runs (None: skipped); ``newest``, the window's newest
        version, lets the decoded batch be screened (``_clean``)."""
        path = sid.path
        if path not in self._tables:
            if path not in self._decoded and sid in self._pending.get(sid.version, ()):
                self._decode_ahead(sid, newest)
            got = self._decoded.pop(path, None)
            if got is None:  # not a pending shard (a retired version's): read on its own
                got = _read_or_error(self.store, path, self.validate, self.needs)
                if isinstance(got, tuple):
                    got = (*got, group_runs(got[0]))
            if isinstance(got, ShardError | StorageError):
                self._skip_shard(path, str(got), ())
                return None
            table, provenance, (runs, interleaved) = got
            problem = identity_problem(path, provenance, groups=len(runs)) or interleaved
            if problem is not None:
                self._skip_shard(path, f"{self.store.uri(path)}: {problem}", tuple(dict.fromkeys(g for *_, g in runs)))
                return None
            self._tables[path] = (table, runs)
        return self._tables[path]

    def _skip_shard(self, path: str, reason: str, groups: tuple[str, ...]) -> None:
        self._events.append(TailEvent(kind="skipped", shard=path, reason=reason, groups=groups))
        self.cursor.shards_skipped += 1
        self.cursor.groups_skipped += len(groups)

    def _group_problem(self, gid: str, version: int, max_version: int, table: pa.Table, clean: bool) -> str | None:
        if gid in self._seen:
            return f"group {gid} was already handed out from {self._seen[gid][1]} (a copy)"
        if clean:
            return None
        if self.needs is None:
            return infra_problem(table)
        return (group_problem(table, self.needs, folder_version=version, newest_version=max_version)
                or infra_problem(table))

    def _finish(self, sid: layout.ShardId) -> None:
        marks = self.cursor.marks.setdefault(sid.version, {})
        marks[sid.worker_id] = max(marks.get(sid.worker_id, -1), sid.seq)
        self.cursor.partial.pop(sid.path, None)
        self._tables.pop(sid.path, None)
        self._decoded.pop(sid.path, None)
        self._clean.pop(sid.path, None)
        self._pending[sid.version].remove(sid)

    def _list(self, version: int) -> list[layout.ShardId]:
        """Shards of ``version`` not listed before and not done, added to its pending list (name order).

        Incremental: only names this tailer has not seen cost anything beyond the listing itself. A name first
        seen below its writer's mark after the folder was listed once was committed out of seq order (writers
        never do that); it is skipped with that reason rather than handed out behind the cursor's back.
        """
        folder = layout.version_dir(version)
        first = version not in self._listed
        known = self._listed.setdefault(version, set())
        pending = self._pending.setdefault(version, [])
        names, self._list_tokens[version] = self.store.list_if_changed(folder, self._list_tokens.get(version))
        new = []
        for name in names or ():
            if name in known:
                continue
            known.add(name)
            sid = layout.parse_shard_path(f"{folder}/{name}")
            if sid is None:
                continue
            if not self.cursor.is_done(sid):
                new.append(sid)
            elif not first:
                self._skip_shard(sid.path, f"{self.store.uri(sid.path)}: listed after later shards of writer "
                                 f"{sid.worker_id} were handed out (committed out of seq order)", ())
        if new:
            pending.extend(new)
            pending.sort()
        return new

    def retire_below(self, window: Window) -> None:
        """Versions older than the window's start are too stale: account their remaining groups as dropped."""
        min_version = window.start
        for version in range(self.cursor.retired_below, min_version):
            self._list(version)
            reason = window.stale_reason(version)
            for sid in self._pending.pop(version):
                path = sid.path
                if sid.groups is not None and path not in self.cursor.partial and path not in self._tables:
                    if sid.groups:  # never opened: its name says how many groups it holds
                        self._events.append(TailEvent(kind="dropped_stale", shard=path, reason=reason,
                                                      unread_groups=sid.groups))
                        self.cursor.groups_dropped_stale += sid.groups
                    self._decoded.pop(path, None)
                    self._clean.pop(path, None)
                    continue
                loaded = self._load(sid)
                if loaded is not None:
                    start = self.cursor.partial.get(path, 0)
                    groups = tuple(g for s, _, g in loaded[1] if s >= start)
                    if groups:
                        self._events.append(TailEvent(kind="dropped_stale", shard=path, groups=groups, reason=reason))
                        self.cursor.groups_dropped_stale += len(groups)
                self.cursor.partial.pop(path, None)
                self._tables.pop(path, None)
                self._decoded.pop(path, None)
                self._clean.pop(path, None)
            self.cursor.marks.pop(version, None)
            self._listed.pop(version, None)
            self._list_tokens.pop(version, None)
        if min_version > self.cursor.retired_below:
            self.cursor.retired_below = min_version
            self._seen = {g: (v, s) for g, (v, s) in self._seen.items() if v >= min_version}

    def next_groups(self, max_groups: int, window: Window) -> list[GroupSlice]:
        """Up to ``max_groups`` whole groups from the versions of ``window``, in order.

        Shards already listed are handed out first; the window's folders are listed again only when they do not
        fill the request, so emptying a window lists it once per batch that ends short, not once per call."""
        if max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        self.retire_below(window)
        versions = range(max(window.start, self.cursor.retired_below), window.version + 1)
        out: list[GroupSlice] = []
        self._hand_out(out, max_groups, versions, window.version)
        if len(out) < max_groups and any([self._list(v) for v in versions]):
            self._hand_out(out, max_groups, versions, window.version)
        return out

    def _hand_out(self, out: list[GroupSlice], max_groups: int, versions: range, max_version: int) -> None:
        for version in versions:
            pending = self._pending.get(version, [])
            while pending:
                if len(out) == max_groups:
                    return
                sid = pending[0]
                path = sid.path
                loaded = self._load(sid, max_version)
                if loaded is None:
                    self._finish(sid)
                    continue
                table, runs = loaded
                start = self.cursor.partial.get(path, 0)
                screened_at, clean = self._clean.get(path, (None, None))
                trusted = screened_at is not None and screened_at <= max_version  # a later newest allows more
                for i, (s, e, gid) in enumerate(runs):
                    if s < start:
                        continue
                    if len(out) == max_groups:
                        return
                    rows = table.slice(s, e - s)
                    problem = self._group_problem(gid, version, max_version, rows, trusted and clean[i])
                    self.cursor.partial[path] = e
                    if problem is not None:
                        self._events.append(TailEvent(kind="skipped", shard=path, reason=problem, groups=(gid,)))
                        self.cursor.groups_skipped += 1
                        continue
                    self._seen[gid] = (version, path)
                    out.append(GroupSlice(shard=path, version=version, row_start=s, row_end=e, group_id=gid,
                                          table=rows))
                    self.cursor.groups_consumed += 1
                self._finish(sid)
