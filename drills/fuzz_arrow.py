"""What the fuzz targets share: the failure a contract check raises, and Arrow IPC bytes built to order.

``drills.fuzz`` runs the targets and ``drills.fuzz_campaign`` holds the campaign-editing one; both raise
``ContractViolation`` and both write hostile Arrow files with ``ipc`` and ``with_meta``.
"""

from __future__ import annotations

import io

import pyarrow as pa


class ContractViolation(AssertionError):
    """The entry point answered hostile input in a way its contract forbids (a bad message, a wrong result)."""


def ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def with_meta(data: bytes, key: bytes, value: bytes) -> bytes:
    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    return ipc(table.replace_schema_metadata({**(table.schema.metadata or {}), key: value}))
