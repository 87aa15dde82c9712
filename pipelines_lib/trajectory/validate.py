"""Invariants every committed shard must satisfy, checked row by row.

``validate_table`` never raises on bad data: it returns ``Violation`` records naming the row, the
trajectory and what is wrong, so the tailer can skip a shard with a recorded reason and the audit can list
every problem. The invariants (DESIGN §3):

- ``tokens``, ``loss_mask``, ``logprobs`` and ``policy_version`` have equal length;
- loss only on policy tokens: ``policy_version >= 0`` exactly where ``loss_mask == 1``; logprobs are finite
  and <= 0 there, and exactly 0 elsewhere; nothing before ``prompt_len`` is a loss token;
- turns are ordered, contiguous segments inside the sequence, the first starting at 0;
- the shard holds whole groups: each ``group_id`` appears ``group_size`` times with ``sample_idx`` 0..G-1;
- ``status`` is known, ``reward`` is finite, ``trajectory_id`` is unique and well-formed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa

from pipelines_lib.trajectory.schema import STATUSES, TOKEN_COLUMNS


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


def _check_row(i: int, row: dict) -> list[Violation]:
    tid = row["trajectory_id"]
    out: list[Violation] = []

    def bad(kind: str, message: str) -> None:
        out.append(Violation(kind=kind, row=i, trajectory_id=tid, message=message))

    lengths = {c: len(row[c] or []) for c in TOKEN_COLUMNS}
    n = lengths["tokens"]
    if len(set(lengths.values())) != 1:
        bad("length_mismatch", ", ".join(f"{c}={v}" for c, v in lengths.items()))
        return out
    if n == 0:
        bad("empty", "no tokens")
        return out
    if tid != f"{row['prompt_id']}/{row['sample_idx']}/{row['worker_id']}":
        bad("bad_id", "trajectory_id is not <prompt_id>/<sample_idx>/<worker_id>")
    if not 0 < row["prompt_len"] <= n:
        bad("prompt_len", f"prompt_len {row['prompt_len']} outside (0, {n}]")
    mask, logp, ver = row["loss_mask"], row["logprobs"], row["policy_version"]
    for t in range(n):
        if mask[t] not in (0, 1):
            bad("loss_mask", f"loss_mask[{t}] = {mask[t]} (must be 0 or 1)")
            break
        if (mask[t] == 1) != (ver[t] >= 0):
            bad("policy_version", f"token {t}: loss_mask={mask[t]} but policy_version={ver[t]}")
            break
        if mask[t] == 1 and not (math.isfinite(logp[t]) and logp[t] <= 0.0):
            bad("logprob", f"token {t}: logprob {logp[t]} is not a finite value <= 0")
            break
        if mask[t] == 0 and logp[t] != 0.0:
            bad("logprob", f"token {t}: non-policy token has logprob {logp[t]} (must be 0)")
            break
        if mask[t] == 1 and t < row["prompt_len"]:
            bad("loss_in_prompt", f"token {t} is inside the prompt but has loss_mask 1")
            break
    turns = row["turns"] or []
    expected_start = 0
    for k, turn in enumerate(turns):
        if turn["start"] != expected_start or not turn["start"] <= turn["end"] <= n:
            bad("turns", f"turn {k} [{turn['start']}, {turn['end']}) does not continue at {expected_start} inside [0, {n}]")
            break
        expected_start = turn["end"]
    else:
        if turns and expected_start != n:
            bad("turns", f"turns end at {expected_start}, sequence has {n} tokens")
    if row["status"] not in STATUSES:
        bad("status", f"unknown status {row['status']!r}")
    if row["reward"] is None or not math.isfinite(row["reward"]):
        bad("reward", f"reward {row['reward']} is not finite")
    return out


def validate_table(table: pa.Table) -> list[Violation]:
    """All invariant violations of one shard's table (empty list = valid)."""
    violations: list[Violation] = []
    rows = table.to_pylist()
    if not rows:
        return [Violation(kind="empty", row=None, trajectory_id=None, message="shard has no rows")]
    seen: dict[str, int] = {}
    groups: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for i, row in enumerate(rows):
        violations.extend(_check_row(i, row))
        tid = row["trajectory_id"]
        if tid in seen:
            violations.append(
                Violation(kind="duplicate", row=i, trajectory_id=tid, message=f"same trajectory_id as row {seen[tid]}")
            )
        seen.setdefault(tid, i)
        groups[row["group_id"]].append((i, row["sample_idx"], row["group_size"]))
    for gid, members in groups.items():
        sizes = {g for _, _, g in members}
        idxs = sorted(s for _, s, _ in members)
        if len(sizes) != 1 or idxs != list(range(next(iter(sizes)))):
            violations.append(
                Violation(
                    kind="incomplete_group",
                    row=members[0][0],
                    trajectory_id=None,
                    message=f"group {gid}: sample_idx {idxs} with group_size {sorted(sizes)}",
                )
            )
    return violations
