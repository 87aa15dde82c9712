"""Host-side bookkeeping of the engine's paged KV cache: which pool blocks each slot holds.

The cache (``model.decoder``) is a pool of ``num_blocks`` blocks of ``block_size`` positions per layer.
A slot's row of ``table`` lists its blocks in position order; unused entries hold ``num_blocks``, the
"no block" id whose writes the model drops. The scheduler reserves, when it admits a request, every block
the request can fill (its prompt plus ``max_new_tokens``, within the context), so a running request never
waits for memory; it admits a request only when that many blocks are free, and returns them the moment
the request finishes (or keeps them with the slot as a reusable prefix, ``EngineConfig.prefix_reuse``).

Reusing a block right after its request finished is safe although the device may still be running a
step that writes into it (a token decoded past a stop id, pipelining): steps run in dispatch order, and
the new owner's prefill is dispatched after that step.
"""

from __future__ import annotations

import numpy as np


class BlockTable:
    def __init__(self, *, num_blocks: int, block_size: int, num_slots: int, max_seq_len: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.width = -(-max_seq_len // block_size)
        """Table entries per slot: blocks of a sequence at the context limit."""
        self.table = np.full((num_slots, self.width), num_blocks, np.int32)
        self._held: list[list[int]] = [[] for _ in range(num_slots)]
        self._free = list(range(num_blocks - 1, -1, -1))  # popped from the end: lowest ids first

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def held(self, slot: int) -> int:
        return len(self._held[slot])

    def fits(self, slot: int, positions: int, *, keep: int = 0) -> bool:
        """Whether ``assign(slot, positions, keep=keep)`` finds enough free blocks."""
        kept = min(self.blocks_for(keep), self.held(slot))
        return self.blocks_for(positions) - kept <= self.free_blocks + self.held(slot) - kept

    def assign(self, slot: int, positions: int, *, keep: int = 0) -> None:
        """Make ``slot`` hold blocks for positions ``[0, positions)``, keeping the blocks of its first ``keep``
        positions (a reused prefix) and returning the rest of what it held."""
        if not self.fits(slot, positions, keep=keep):
            raise RuntimeError(f"slot {slot}: {positions} positions need more than the {self.free_blocks} free blocks")
        held = self._held[slot]
        kept = held[: self.blocks_for(keep)]
        self._free += reversed(held[len(kept) :])
        self._held[slot] = kept + [self._free.pop() for _ in range(self.blocks_for(positions) - len(kept))]
        self.table[slot] = self.num_blocks
        self.table[slot, : len(self._held[slot])] = self._held[slot]

    def release(self, slot: int) -> None:
        self.assign(slot, 0)


class SlotMemory:
    """What each slot's blocks hold: a running request's reservation, or, for a free slot with prefix reuse,
    the tokens of its finished request (``retained``) that a later prompt extending them can skip."""

    def __init__(self, blocks: BlockTable) -> None:
        self.blocks = blocks
        self.retained: list[list[int]] = [[] for _ in range(len(blocks.table))]

    def reusable(self, slot: int, prompt: list[int]) -> int:
        """Leading prompt tokens whose keys/values ``slot`` still holds (never the last prompt token,
        which the decode step feeds)."""
        retained = self.retained[slot]
        limit = min(len(retained), len(prompt) - 1)
        n = 0
        while n < limit and retained[n] == prompt[n]:
            n += 1
        return n

    def choose(self, free: list[int], prompt: list[int]) -> int:
        """The free slot holding the longest prefix of ``prompt``, else one holding nothing (keeping other
        retained prefixes), else the lowest-numbered."""
        return max(free, key=lambda i: (self.reusable(i, prompt), not self.retained[i], -i))

    def reserve(self, slot: int, positions: int, reused: int, idle: list[int]) -> bool:
        """Give ``slot`` blocks for ``positions`` positions, keeping its ``reused`` prefix and evicting prefixes
        retained by the ``idle`` slots while that is short; False if even evicting them all is."""
        evictable = [i for i in idle if i != slot and self.blocks.held(i)]
        while not self.blocks.fits(slot, positions, keep=reused) and evictable:
            self.forget([evictable.pop()])
        if not self.blocks.fits(slot, positions, keep=reused):
            return False
        self.blocks.assign(slot, positions, keep=reused)
        self.retained[slot] = []
        return True

    def finish(self, slot: int, retained: list[int]) -> None:
        """The slot's request finished: keep the blocks of ``retained`` (empty: return them all)."""
        self.retained[slot] = retained
        self.blocks.assign(slot, len(retained), keep=len(retained))

    def forget(self, slots: list[int]) -> None:
        for i in slots:
            self.retained[i] = []
            self.blocks.release(i)
