"""Host-side bookkeeping of the engine's paged KV cache: which pool blocks each slot reads and writes, and
which free blocks still hold keys/values a later prompt can reuse.

The cache (``model.decoder``) is a pool of ``num_blocks`` blocks of ``block_size`` positions per layer.
A slot's row of ``table`` lists its blocks in position order; unused entries hold ``num_blocks``, the
"no block" id whose writes the model drops. The scheduler reserves, when it admits a request, every block
the request can fill (its prompt plus ``max_new_tokens``, within the context), so a running request never
waits for memory; it admits a request only when that many blocks are free, and returns them the moment the
request finishes.

**Prefix cache** (``EngineConfig.prefix_reuse``). A finished request's blocks return to the pool still
holding its tokens' keys/values, indexed by content in a trie: a block's key is its parent block (the one
before it in the sequence, or the root) and the tokens it holds, so a key names the whole prefix up to the
block's end. Nothing ties a cached block to the slot that wrote it, so the next turn of a conversation finds
its prefix wherever it is admitted, however many other requests came and went in between. A new prompt
walks the trie block by block:

* a **full** block whose tokens the prompt repeats is *shared*: any number of running requests read it
  (reference counted), and none writes it, since each writes only past its reused prefix;
* where the prompt stops matching whole blocks, the cached child block sharing the longest run of tokens
  with the rest of the prompt (a partly filled last block, or a block the prompt diverges within) is
  *adopted*: it leaves the cache and the request writes its own tokens into it from the divergence on.
  Only a block no running request reads can be adopted.

Free blocks are handed out uncached ones first, then cached ones least recently released first (a
sequence's blocks are released tail first, so its head, shared by more prompts, stays longest). Evicting
a block from the cache also evicts its descendants: their keys/values were computed over its contents.

Reusing a block right after its request left its slot is safe although the device may still be running a
call that writes into it (the request's last tokens in flight, pipelining): calls run in dispatch order, those
writes land past the retained tokens, and the new owner's prefill is dispatched after that call. No call
dispatched after the release writes for the old request (a row stopped on the device writes nothing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

ROOT = -1
"""Parent of a sequence's first block in the trie."""


class BlockPool:
    def __init__(self, *, num_blocks: int, block_size: int, num_slots: int, max_seq_len: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # One table entry per block of a sequence at the context limit.
        self.table = np.full((num_slots, -(-max_seq_len // block_size)), num_blocks, np.int32)
        self._held: list[list[int]] = [[] for _ in range(num_slots)]
        self._refs = [0] * num_blocks
        self._uncached = list(range(num_blocks - 1, -1, -1))  # popped from the end: lowest ids first
        self._lru: OrderedDict[int, None] = OrderedDict()
        """Cached blocks no running request reads, least recently released first."""
        self._children: dict[int, dict[tuple[int, ...], int]] = {}
        """Trie of cached blocks: parent block (or ``ROOT``) -> tokens held -> block."""
        self._key: dict[int, tuple[int, tuple[int, ...]]] = {}
        """Cached block -> (parent, tokens): its place in ``_children``."""

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    @property
    def free_blocks(self) -> int:
        """Blocks no running request holds (cached ones included: they are evicted when needed)."""
        return len(self._uncached) + len(self._lru)

    @property
    def cached_blocks(self) -> int:
        return len(self._key)

    def match(self, prompt: Sequence[int]) -> tuple[list[int], int | None, int]:
        """(full blocks to share, block to adopt or None, leading prompt tokens their keys/values cover) for
        ``prompt``; never covers the last prompt token, which the decode step feeds."""
        limit, size = len(prompt) - 1, self.block_size
        shared: list[int] = []
        parent = ROOT
        while True:
            start = len(shared) * size
            children = self._children.get(parent, {})
            piece = tuple(prompt[start : start + size])
            if start + size <= limit and piece in children:
                parent = children[piece]
                shared.append(parent)
                continue
            rest = prompt[start:limit]
            best, covered = None, 0
            for tokens, block in children.items():
                if self._refs[block] == 0:
                    n = _common(tokens, rest)
                    if n > covered:
                        best, covered = block, n
            return shared, best, start + covered

    def admit(self, slot: int, prompt: Sequence[int], positions: int, *, min_reuse: int | None = 1) -> int | None:
        """Give ``slot`` blocks for ``positions`` positions, starting with the cached blocks of the longest
        prefix of ``prompt`` if they cover at least ``min_reuse`` of its tokens (None: never reuse); returns
        how many prompt tokens they cover, or None (nothing changed) when the free blocks are short."""
        if self._held[slot]:
            raise RuntimeError(f"slot {slot} still holds {len(self._held[slot])} blocks")
        shared, adopted, reused = self.match(prompt) if min_reuse is not None else ([], None, 0)
        if min_reuse is not None and reused < min_reuse:
            shared, adopted, reused = [], None, 0
        kept = shared + ([adopted] if adopted is not None else [])
        idle_kept = sum(1 for b in kept if self._refs[b] == 0)  # counted in free_blocks until taken
        if self.blocks_for(positions) - len(kept) > self.free_blocks - idle_kept:
            return None
        for block in shared:
            self._refs[block] += 1
            self._lru.pop(block, None)
        if adopted is not None:
            self._lru.pop(adopted)
            self._uncache(adopted)
            self._refs[adopted] = 1
        self._held[slot] = kept + [self._take() for _ in range(self.blocks_for(positions) - len(kept))]
        self.table[slot] = self.num_blocks
        self.table[slot, : len(self._held[slot])] = self._held[slot]
        return reused

    def release(self, slot: int, retained: Sequence[int] = ()) -> None:
        """The slot's request is done: cache the blocks holding the keys/values of ``retained`` (its leading
        tokens) for later prompts, and return every block it held."""
        held = self._held[slot]
        parent = ROOT
        for i in range(self.blocks_for(len(retained))):
            tokens = tuple(retained[i * self.block_size : (i + 1) * self.block_size])
            block = self._children.get(parent, {}).get(tokens)
            if block is None and held[i] not in self._key:
                block = held[i]
                self._key[block] = (parent, tokens)
                self._children.setdefault(parent, {})[tokens] = block
            if block is None:
                break  # held[i] is cached under another prefix: nothing below it can be keyed
            parent = block
        for block in reversed(held):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key:
                    self._lru[block] = None
                else:
                    self._uncached.append(block)
        self._held[slot] = []
        self.table[slot] = self.num_blocks

    def clear_cache(self) -> None:
        """Forget every cached prefix (new weights): blocks in use stay with their requests."""
        self._uncached += reversed(self._lru)
        self._lru.clear()
        self._children.clear()
        self._key.clear()

    def _take(self) -> int:
        if self._uncached:
            block = self._uncached.pop()
        else:
            block, _ = self._lru.popitem(last=False)
            self._uncache(block)
        self._refs[block] = 1
        return block

    def _uncache(self, block: int) -> None:
        """Drop ``block`` and its descendants from the cache; descendants no request reads become uncached."""
        parent, tokens = self._key.pop(block)
        siblings = self._children[parent]
        del siblings[tokens]
        if not siblings:
            del self._children[parent]
        stack = list(self._children.pop(block, {}).values())
        while stack:
            child = stack.pop()
            del self._key[child]
            stack += self._children.pop(child, {}).values()
            if child in self._lru:
                del self._lru[child]
                self._uncached.append(child)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):  # stops at the shorter
        if x != y:
            break
        n += 1
    return n
