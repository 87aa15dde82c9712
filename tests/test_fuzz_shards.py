"""Hostile shard bytes through ``decode_shard`` and the ``ShardTailer``: only ``ShardError`` naming the shard, and
the tailer records a ``skipped`` event instead of raising (contracts: drills/fuzz.py)."""

from __future__ import annotations

from hypothesis import given, settings

from drills.fuzz import check_shard, shard_inputs


@settings(max_examples=500, deadline=None)
@given(shard_inputs())
def test_any_bytes_in_a_shard_are_decoded_or_refused_naming_the_shard(data: bytes) -> None:
    check_shard(data)
