"""The one clock format of records and logs: UTC, ISO 8601 with microseconds. A module of its own, free of Arrow
and NumPy, so processes that only read records (the audit's merging process) stay small."""

from __future__ import annotations

import datetime as dt


def utc_now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
