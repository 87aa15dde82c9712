"""Invariants every committed shard must satisfy, checked row by row.

``validate_table`` never raises on bad data: it returns ``Violation`` records naming the row, the
trajectory and what is wrong, so the tailer can skip a shard with a recorded reason and the audit can list
every problem. The invariants (ARCHITECTURE §3):

- ``tokens``, ``loss_mask``, ``logprobs`` and ``policy_version`` have equal length;
- loss only on policy tokens: ``policy_version >= 0`` exactly where ``loss_mask == 1``; logprobs are finite
  and <= 0 there, and exactly 0 elsewhere; nothing before ``prompt_len`` is a loss token;
- turns are ordered, contiguous segments inside the sequence, the first starting at 0;
- ``version`` is the group's oldest policy version over its loss tokens (0 if none);
- the shard holds whole groups: each ``group_id`` appears ``group_size`` times with ``sample_idx`` 0..G-1;
- ``status`` is known, ``reward`` is finite, ``trajectory_id`` is unique and well-formed.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines_lib.trajectory.record import table_group_versions
from pipelines_lib.trajectory.schema import STATUSES, TOKEN_COLUMNS, TRAJECTORY_SCHEMA


@dataclass(frozen=True, kw_only=True)
class Violation:
    kind: str
    row: int | None
    trajectory_id: str | None
    message: str

    def __str__(self) -> str:
        where = f"row {self.row}" if self.row is not None else "shard"
        tid = f" ({self.trajectory_id})" if self.trajectory_id else ""
        return f"{where}{tid}: {self.kind}: {self.message}"


def _token_checks(table: pa.Table, rows: np.ndarray, prompt_len: np.ndarray) -> dict[int, tuple[str, str]]:
    """First token-level violation of each row in ``rows`` (all four token columns of equal length there)."""
    # Every row, the common case, is the table itself: a take would copy it whole.
    sub = table if len(rows) == table.num_rows else table.take(pa.array(rows, pa.int64()))
    lengths = pc.list_value_length(sub.column("tokens")).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = {c: pc.list_flatten(sub.column(c)).to_numpy(zero_copy_only=False) for c in TOKEN_COLUMNS[1:]}
    mask, logp, ver = flat["loss_mask"].astype(np.int64), flat["logprobs"].astype(np.float64), flat["policy_version"]
    row_of = np.repeat(np.arange(len(rows)), lengths)
    pos = np.arange(len(mask)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    on = mask == 1
    checks = [
        ("loss_mask", (mask != 0) & ~on, lambda t: f"loss_mask[{t}] = {mask[t]} (must be 0 or 1)"),
        ("policy_version", on != (ver >= 0),
         lambda t: f"token {pos[t]}: loss_mask={mask[t]} but policy_version={ver[t]}"),
        ("logprob", on & ~(np.isfinite(logp) & (logp <= 0.0)),
         lambda t: f"token {pos[t]}: logprob {logp[t]} is not a finite value <= 0"),
        ("logprob", ~on & (logp != 0.0), lambda t: f"token {pos[t]}: non-policy token has logprob {logp[t]} (must be 0)"),
        ("loss_in_prompt", on & (pos < prompt_len[rows][row_of]),
         lambda t: f"token {pos[t]} is inside the prompt but has loss_mask 1"),
    ]
    found: dict[int, tuple[str, str]] = {}
    for kind, bad, message in checks:
        for t in np.flatnonzero(bad):
            row = int(rows[row_of[t]])
            if row not in found:
                found[row] = (kind, message(t))
    return found


_STATUSES = pa.array(STATUSES)


def _turns_suspect(turns: pa.ChunkedArray, n: np.ndarray) -> np.ndarray:
    """Rows whose turns may break the turn invariants (a null turn or field, a gap, an overlap, a turn past the
    sequence, or turns that stop short of its end); a superset of the rows the row-by-row check rejects."""
    arr = turns.combine_chunks()
    flat = pc.list_flatten(arr)
    suspect = np.zeros(len(n), bool)
    if len(flat) == 0:
        return suspect
    row = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    fields = [flat.field(name) for name in ("role", "start", "end")]
    nulls = np.asarray(flat.is_null()) | np.any([np.asarray(f.is_null()) for f in fields], axis=0)
    start, end = (f.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) for f in fields[1:])
    first = np.r_[True, row[1:] != row[:-1]]
    last = np.r_[row[1:] != row[:-1], True]
    expected = np.where(first, 0, np.r_[0, end[:-1]])
    bad = nulls | (start != expected) | (start > end) | (end > n[row]) | (last & (end != n[row]))
    suspect[row[bad]] = True
    return suspect


def validate_table(table: pa.Table) -> list[Violation]:
    """All invariant violations of one shard's table (empty list = valid). Token checks are vectorised."""
    return validate_tables([table])[0]


def _nulls(table: pa.Table) -> list[Violation]:
    """The IPC reader does not enforce non-nullable fields; every other check assumes values."""
    nulls = [Violation(kind="null_value", row=table.column(f.name).to_pylist().index(None), trajectory_id=None,
                       message=f"column {f.name!r} has {table.column(f.name).null_count} null value(s)")
             for f in TRAJECTORY_SCHEMA if not f.nullable and table.column(f.name).null_count]
    return nulls + [Violation(kind="null_value", row=None, trajectory_id=None,
                              message=f"column {c!r} has {pc.list_flatten(table.column(c)).null_count} null element(s)")
                    for c in TOKEN_COLUMNS if pc.list_flatten(table.column(c)).null_count]


def validate_tables(tables: Sequence[pa.Table]) -> list[list[Violation]]:
    """``validate_table`` of each of ``tables`` (rows numbered within each), checked together.

    A small shard's checks cost their fixed overhead (a few dozen Arrow calls) far more than its rows, so the
    row checks run once over the tables concatenated, and only the per-shard ones (empty, nulls, duplicates,
    whole groups) table by table. Tables that share a group id, hold nulls or are empty are checked one by one.
    """
    if not tables:
        return []
    if len(tables) == 1 and tables[0].num_rows == 0:
        return [[Violation(kind="empty", row=None, trajectory_id=None, message="shard has no rows")]]
    try:
        table = pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]  # Arrow calls cost per chunk
    except pa.ArrowInvalid:  # schemas that differ in more than metadata
        return [validate_tables([t])[0] for t in tables]
    ends = np.cumsum([t.num_rows for t in tables])
    nulls = _nulls(table)
    if len(tables) > 1 and (nulls or 0 in ends - np.r_[0, ends[:-1]]):
        return [validate_tables([t])[0] for t in tables]
    if nulls:
        return [nulls]
    shard_of = np.repeat(np.arange(len(tables)), np.diff(ends, prepend=0))
    group = _codes(table.column("group_id"))
    if len(tables) > 1 and len(np.unique(group)) != len(np.unique(shard_of * (len(group) + 1) + group)):
        return [validate_tables([t])[0] for t in tables]  # a group id in two tables
    by_row = _row_violations(table, ends)
    irregular = set(_irregular_shards(table, shard_of, group).tolist())
    out = []
    for k, (first, end) in enumerate(zip(np.r_[0, ends[:-1]].tolist(), ends.tolist(), strict=True)):
        violations = [dataclasses.replace(v, row=v.row - first) for i in sorted(r for r in by_row if first <= r < end)
                      for v in by_row[i]]
        if k in irregular:
            violations += _membership(table.slice(first, end - first))
        out.append(violations)
    return out


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    """An integer per row, equal for equal values (a null-free column)."""
    return pc.dictionary_encode(column.combine_chunks()).indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _irregular_shards(table: pa.Table, shard_of: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Shards (indices into the tables ``table`` concatenates, by row ``shard_of``) that may repeat a trajectory id
    or hold a group whose rows are not ``sample_idx`` 0..G-1 of one ``group_size`` G: the few that ``_membership``
    then words, row by row."""
    stride = len(shard_of) + 1
    ids = shard_of * stride + _codes(table.column("trajectory_id"))
    _, first = np.unique(ids, return_index=True)
    repeated = np.ones(len(ids), bool)
    repeated[first] = False
    key = shard_of * stride + group
    sample = table.column("sample_idx").to_numpy(zero_copy_only=False).astype(np.int64)
    size = table.column("group_size").to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.lexsort((sample, key))
    key, sample, size = key[order], sample[order], size[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    lengths = np.diff(np.r_[starts, len(key)])
    run = np.repeat(np.arange(len(starts)), lengths)
    whole = (sample == np.arange(len(key)) - starts[run]) & (size == lengths[run])
    return np.unique(np.r_[shard_of[repeated], shard_of[order][~whole]])


def _membership(table: pa.Table) -> list[Violation]:
    """Repeated trajectory ids and groups that are not whole, in one shard's table (rows numbered within it)."""
    ids, group_ids = table.column("trajectory_id").to_pylist(), table.column("group_id").to_pylist()
    samples, sizes = table.column("sample_idx").to_pylist(), table.column("group_size").to_pylist()
    violations = []
    seen: dict[str, int] = {}
    groups: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for i, tid in enumerate(ids):
        if tid in seen:
            violations.append(Violation(kind="duplicate", row=i, trajectory_id=tid,
                                        message=f"same trajectory_id as row {seen[tid]}"))
        seen.setdefault(tid, i)
        groups[group_ids[i]].append((i, samples[i], sizes[i]))
    for gid, members in groups.items():
        sizes_of = {g for _, _, g in members}
        idxs = sorted(s for _, s, _ in members)
        # group_size is data: held against the rows present before a range of that size is built (2**31 - 1 is an
        # int32 like any other).
        if len(sizes_of) != 1 or next(iter(sizes_of)) != len(idxs) or idxs != list(range(len(idxs))):
            shown = f"{idxs[:8]}" if len(idxs) <= 8 else f"{idxs[:8]} (+{len(idxs) - 8} more)"
            violations.append(Violation(kind="incomplete_group", row=members[0][0], trajectory_id=None,
                                        message=f"group {gid}: sample_idx {shown} with group_size "
                                                f"{sorted(sizes_of)[:8]}"))
    return violations


def _row_violations(table: pa.Table, ends: np.ndarray) -> dict[int, list[Violation]]:
    """Row -> its violations, in check order, for a null-free ``table`` of shards ending at rows ``ends``."""
    prompt_len = table.column("prompt_len").to_numpy(zero_copy_only=False)
    lengths = {c: pc.list_value_length(table.column(c)).fill_null(0).to_numpy(zero_copy_only=False)
               for c in TOKEN_COLUMNS}
    n = lengths["tokens"]
    by_row: dict[int, list[Violation]] = defaultdict(list)
    equal = np.all([lengths[c] == n for c in TOKEN_COLUMNS], axis=0) & (n > 0)
    token_found = _token_checks(table, np.flatnonzero(equal), prompt_len) if equal.any() else {}
    # Vectorised screen; only the rows it flags take the row-by-row checks below (which word the messages).
    suspect = ~equal | (prompt_len <= 0) | (prompt_len > n) | _turns_suspect(table.column("turns"), n)
    suspect |= ~np.isfinite(table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64))
    well_named = pc.equal(table.column("trajectory_id"), pc.binary_join_element_wise(
        table.column("prompt_id"), table.column("sample_idx").cast(pa.string()), table.column("worker_id"), "/"))
    known = pc.is_in(table.column("status"), value_set=_STATUSES)
    suspect |= ~pc.and_(well_named, known).to_numpy(zero_copy_only=False)
    turns_col = table.column("turns")
    flagged = sorted({*np.flatnonzero(suspect).tolist(), *token_found})
    # Python values of the flagged rows only (the messages word them); a clean batch builds none.
    rows = pa.array(flagged, pa.int64())
    scalars = {c: dict(zip(flagged, table.column(c).take(rows).to_pylist(), strict=True))
               for c in ("trajectory_id", "prompt_id", "sample_idx", "worker_id", "status", "reward")}

    def violation(i: int, kind: str, message: str) -> None:
        by_row[i].append(Violation(kind=kind, row=i, trajectory_id=scalars["trajectory_id"][i], message=message))

    for i in flagged:
        tid = scalars["trajectory_id"][i]

        def bad(kind: str, message: str, i: int = i) -> None:
            violation(i, kind, message)

        if not equal[i]:
            if n[i] == 0 and all(lengths[c][i] == 0 for c in TOKEN_COLUMNS):
                bad("empty", "no tokens")
            else:
                bad("length_mismatch", ", ".join(f"{c}={lengths[c][i]}" for c in TOKEN_COLUMNS))
            continue
        if tid != f"{scalars['prompt_id'][i]}/{scalars['sample_idx'][i]}/{scalars['worker_id'][i]}":
            bad("bad_id", "trajectory_id is not <prompt_id>/<sample_idx>/<worker_id>")
        if not 0 < prompt_len[i] <= n[i]:
            bad("prompt_len", f"prompt_len {prompt_len[i]} outside (0, {n[i]}]")
        if i in token_found:
            bad(*token_found[i])
        turns = turns_col[i].as_py() or []
        expected_start = 0
        for k, turn in enumerate(turns):
            if turn is None or turn["start"] is None or turn["end"] is None or turn["role"] is None:
                bad("turns", f"turn {k} is null or lacks role/start/end")
                break
            if turn["start"] != expected_start or not turn["start"] <= turn["end"] <= n[i]:
                bad("turns", f"turn {k} [{turn['start']}, {turn['end']}) does not continue at {expected_start} "
                             f"inside [0, {n[i]}]")
                break
            expected_start = turn["end"]
        else:
            if turns and expected_start != n[i]:
                bad("turns", f"turns end at {expected_start}, sequence has {n[i]} tokens")
        if scalars["status"][i] not in STATUSES:
            bad("status", f"unknown status {scalars['status'][i]!r}")
        reward = scalars["reward"][i]
        if reward is None or not math.isfinite(reward):
            bad("reward", f"reward {reward} is not finite")
    # Only on otherwise valid tokens, in shards without a token finding: a damaged policy_version would also move
    # its group's version, and one damaged token should be one finding.
    shard_of = np.searchsorted(ends, np.arange(table.num_rows), side="right")
    damaged = np.isin(shard_of, shard_of[list(token_found)])
    stored = table.column("version").to_numpy(zero_copy_only=False)
    derived = table_group_versions(table).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(equal & ~damaged & (stored != derived)).tolist():
        by_row[i].append(Violation(kind="version", row=i, trajectory_id=table.column("trajectory_id")[i].as_py(),
                                   message=f"version {stored[i]}, but the group's oldest loss-token policy_version "
                                           f"is {derived[i]}"))
    return by_row
