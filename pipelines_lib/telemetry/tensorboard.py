"""TensorBoard event files of scalar gauges, written without TensorFlow: what ``tensorboard --logdir`` reads.

```
file   = record*                                   TFRecord framing, one record per Event
record = uint64 length, uint32 masked_crc32c(length), bytes data, uint32 masked_crc32c(data)   (little endian)
Event  = 1: wall_time (double), 2: step (int64), 3: file_version (string) | 5: summary (Summary)
Summary = repeated 1: Value;  Value = 1: tag (string), 2: simple_value (float)
```
The first Event of a file carries ``file_version = "brain.Event:2"``. The store is create-only, so each telemetry
flush writes a whole new file (``layout.tensorboard_file``: ``telemetry/tb/<process>/events.out.tfevents.…``);
TensorBoard reads every event file of a run folder, local or ``gs://``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import google_crc32c

FILE_VERSION = b"brain.Event:2"


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant (``tensorflow/core/lib/hash/crc32c.h``)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative steps
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, *, step: int = 0, tag: str | None = None, value: float = 0.0,
          file_version: bytes | None = None) -> bytes:
    """One serialised Event: a scalar ``tag`` = ``value`` at ``step``, or the file-version header."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step)
    if file_version is not None:
        return out + _field(3, file_version)
    scalar = _field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)  # type: ignore[union-attr]
    return out + _field(5, _field(1, scalar))


def tfrecord(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def event_file(scalars: Iterable[tuple[str, int, float, float]], *, wall_time: float) -> bytes:
    """A whole event file: the version header at ``wall_time``, then ``(tag, step, value, wall_time)`` scalars."""
    body = tfrecord(event(wall_time, file_version=FILE_VERSION))
    return body + b"".join(tfrecord(event(t, step=step, tag=tag, value=value)) for tag, step, value, t in scalars)


__all__ = ["event_file", "masked_crc32c"]
