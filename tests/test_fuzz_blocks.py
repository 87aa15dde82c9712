"""The KV pool's bookkeeping (``engine.blocks.BlockPool``) under random admissions, releases and cache clears,
against a model of what the device writes into each block.

The model records, per block and offset, the sequence whose last token's keys/values were last written
there (keys/values depend on every token before, through attention): a prefill writes a prompt's positions
from its reused prefix on, decoding writes each fed token's, and nothing is ever cleared (as on the device).
Two properties pin the prefix cache's safety:

- a slot told that ``reused`` leading prompt tokens are cached reads exactly the keys/values of its prompt's
  positions below ``reused``, computed over the same tokens before them;
- every position a slot writes lies in a block no other slot holds (shared blocks are read-only).

Small block sizes and a three-token alphabet make shared and partly matching blocks common.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines_lib.engine.blocks import BlockPool

SLOTS = 3
MAX_LEN = 12
TOKENS = st.integers(1, 3)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_a_slot_reads_only_its_own_tokens_and_writes_only_blocks_nobody_else_holds(data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 4), label="block_size")
    per_sequence = -(-MAX_LEN // size)
    pool = BlockPool(num_blocks=data.draw(st.integers(per_sequence, 3 * per_sequence), label="num_blocks"),
                     block_size=size, num_slots=SLOTS, max_seq_len=MAX_LEN)
    written: dict[int, dict[int, tuple[int, ...]]] = {}
    running: dict[int, tuple[list[int], int]] = {}
    released: list[list[int]] = [[]]

    def write(slot: int, position: int, sequence: list[int]) -> None:
        block = int(pool.table[slot][position // size])
        assert block < pool.num_blocks, f"slot {slot} writes position {position} outside its blocks"
        others = [s for s in running if s != slot and block in pool.table[s]]
        assert not others, f"slot {slot} writes block {block}, which slots {others} hold too"
        written.setdefault(block, {})[position % size] = tuple(sequence[: position + 1])

    for _ in range(data.draw(st.integers(1, 40), label="operations")):
        op = data.draw(st.sampled_from(["admit", "admit", "release", "clear"]))
        free = [s for s in range(SLOTS) if s not in running]
        if op == "admit" and free:
            slot = data.draw(st.sampled_from(free))
            # A released sequence's head, then the same positions of another one (a different prefix before
            # tokens some cached block holds), then new tokens.
            head = data.draw(st.sampled_from(released))
            head = head[: data.draw(st.integers(0, len(head)))]
            other = data.draw(st.sampled_from(released))[len(head) :]
            prompt = (head + other[: data.draw(st.integers(0, len(other)))]
                      + data.draw(st.lists(TOKENS, min_size=1, max_size=3)))[: MAX_LEN - 1]
            positions = data.draw(st.integers(len(prompt), MAX_LEN))
            reused = pool.admit(slot, prompt, positions, min_reuse=data.draw(st.integers(1, 3)))
            if reused is None:
                continue
            assert 0 <= reused <= len(prompt) - 1
            row = pool.table[slot]
            read = [written.get(int(row[p // size]), {}).get(p % size) for p in range(reused)]
            assert read == [tuple(prompt[: p + 1]) for p in range(reused)], f"slot {slot} misreads {prompt}"
            for p in range(reused, len(prompt) - 1):  # the prefill
                write(slot, p, prompt)
            running[slot] = (prompt, positions)
        elif op == "release" and running:
            slot = data.draw(st.sampled_from(sorted(running)))
            prompt, positions = running[slot]
            sequence = prompt + data.draw(st.lists(TOKENS, max_size=positions - len(prompt)))
            for p in range(len(prompt) - 1, len(sequence) - 1):  # decoding feeds all but the newest token
                write(slot, p, sequence)
            del running[slot]
            pool.release(slot, sequence[:-1] if data.draw(st.booleans()) else [])
            released.append(sequence[:-1])
        elif op == "clear":
            pool.clear_cache()
        held = {int(b) for s in running for b in pool.table[s] if b < pool.num_blocks}
        assert pool.free_blocks + len(held) == pool.num_blocks, "a block is lost or counted twice"
        assert all((pool.table[s] == pool.num_blocks).all() for s in range(SLOTS) if s not in running)
