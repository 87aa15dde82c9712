"""The tail cursor: how far the trainer has read the trajectory stream, small and plain (no Arrow).

The records (a consumption log carries a cursor delta, a checkpoint the whole cursor) and the audit import this
module without the reader's decoding machinery. ``reader.ShardTailer`` moves a ``TailCursor`` forward and
reports what it did not hand out as ``TailEvent``s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pipelines_lib.storage import layout


@dataclass(frozen=True, kw_only=True)
class TailEvent:
    kind: str
    """``skipped`` (a shard or group the trainer cannot use) or ``dropped_stale`` (window moved past it)."""
    shard: str
    reason: str
    groups: tuple[str, ...] = ()
    unread_groups: int = 0
    """``dropped_stale`` of a shard never opened: how many groups its name declares (their ids are not named)."""


CURSOR_FORMAT = 2
"""Format of ``TailCursor.to_json``; format 1 (a list of every handed-out shard name per version) still reads."""


def _cursor_error(what: str, e: BaseException) -> ValueError:
    return ValueError(f"not a rollstream tail {what}: {e!r}")


@dataclass
class TailCursor:
    """Serialisable progress of a tailer. Versions below ``retired_below`` are never listed again.

    Its size is bounded by writers x versions in the window, whatever the campaign's age: a writer commits its
    shards in ``seq`` order, so "every shard of writer w in version v up to seq s is done" is one number.
    """

    marks: dict[int, dict[str, int]] = field(default_factory=dict)
    """version -> writer -> highest seq of that writer's shards in the version handed out (or skipped)."""
    partial: dict[str, int] = field(default_factory=dict)
    """shard path -> rows handed out so far, for a shard not yet finished (the only exceptions to ``marks``)."""
    retired_below: int = 0
    groups_consumed: int = 0
    groups_dropped_stale: int = 0
    shards_skipped: int = 0
    groups_skipped: int = 0
    """Groups the trainer cannot train on (in skipped shards, or skipped one by one)."""

    def is_done(self, sid: layout.ShardId) -> bool:
        return sid.seq <= self.marks.get(sid.version, {}).get(sid.worker_id, -1)

    def _plain(self) -> dict:
        return {
            "format": CURSOR_FORMAT,
            "marks": {str(v): dict(sorted(w.items())) for v, w in sorted(self.marks.items())},
            "partial": dict(sorted(self.partial.items())),
            "retired_below": self.retired_below,
            "groups_consumed": self.groups_consumed,
            "groups_dropped_stale": self.groups_dropped_stale,
            "shards_skipped": self.shards_skipped,
            "groups_skipped": self.groups_skipped,
        }

    def to_json(self) -> str:
        return json.dumps(self._plain(), sort_keys=True, separators=(",", ":"))

    def copy(self) -> TailCursor:
        return TailCursor.from_json(self.to_json())

    @classmethod
    def from_json(cls, text: str) -> TailCursor:
        try:
            raw = json.loads(text)
            if "done" in raw:  # format 1: every handed-out shard name of each live version
                marks: dict[int, dict[str, int]] = {}
                for v, names in raw["done"].items():
                    for name in names:
                        sid = layout.parse_shard_path(f"{layout.version_dir(int(v))}/{name}")
                        if sid is not None:
                            w = marks.setdefault(sid.version, {})
                            w[sid.worker_id] = max(w.get(sid.worker_id, -1), sid.seq)
            else:
                marks = {int(v): {str(w): int(s) for w, s in ws.items()} for v, ws in raw["marks"].items()}
            return cls(
                marks=marks,
                partial={str(k): int(n) for k, n in raw["partial"].items()},
                retired_below=int(raw["retired_below"]),
                groups_consumed=int(raw["groups_consumed"]),
                groups_dropped_stale=int(raw["groups_dropped_stale"]),
                shards_skipped=int(raw["shards_skipped"]),
                groups_skipped=int(raw.get("groups_skipped", 0)),  # cursors saved before groups were skipped
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise _cursor_error("cursor", e) from e

    def delta_json(self, before: TailCursor) -> str:
        """What changed since ``before``: the marks and partial shards that moved (a partial shard that finished
        maps to null) and the totals. A consumption log carries this; ``before.after(delta)`` is this cursor."""
        plain = self._plain()
        plain["marks"] = {str(v): moved for v, ws in sorted(self.marks.items())
                          if (moved := {w: s for w, s in sorted(ws.items()) if before.marks.get(v, {}).get(w) != s})}
        plain["partial"] = {**{p: n for p, n in sorted(self.partial.items()) if before.partial.get(p) != n},
                            **{p: None for p in sorted(before.partial) if p not in self.partial}}
        return json.dumps(plain, sort_keys=True, separators=(",", ":"))

    def after(self, delta: str) -> TailCursor:
        """The cursor that ``delta`` (a ``delta_json``) leads to from this one."""
        try:
            raw = json.loads(delta)
            out = TailCursor.from_json(json.dumps({**raw, "marks": {}, "partial": {}}))
            out.marks = {v: dict(ws) for v, ws in self.marks.items() if v >= out.retired_below}
            for v, ws in raw["marks"].items():
                out.marks.setdefault(int(v), {}).update({str(w): int(s) for w, s in ws.items()})
            out.partial = dict(self.partial)
            for path, rows in raw["partial"].items():
                if rows is None:
                    out.partial.pop(path, None)
                else:
                    out.partial[str(path)] = int(rows)
            return out
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise _cursor_error("cursor delta", e) from e
