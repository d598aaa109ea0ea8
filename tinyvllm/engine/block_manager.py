"""Paged KV-cache bookkeeping (host side): which device blocks each sequence owns, plus a prefix cache.

The device pool is [num_blocks, block_size, ...]; the token at position p of a sequence lives at
slot = block_table[p // block_size] * block_size + p % block_size.

Blocks are ref-counted. Unreferenced blocks sit in an LRU free queue (freed blocks go to the tail,
allocation takes from the head). With prefix caching a FULL block is named by a chained hash of its
token ids, hash(parent block's hash, token ids), so equal hashes mean equal whole prefixes. A freed
full block keeps its hash and can be reused by a later sequence with the same prefix until it is
taken from the free queue for new data (evicted).

Nothing is built per block up front (a pool sized from GPU memory can hold millions of blocks, most never
used): the free queue starts as blocks 0..num_blocks-1 in order, and since freed blocks join at the tail,
the blocks never allocated yet are always its head, in id order. So the queue is a counter (the lowest
never-allocated id) followed by the freed blocks in the order they were freed, and a block's record is
made when it is first allocated.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass

from tinyvllm.engine.sequence import Sequence


def block_hash(parent_hash: bytes | None, token_ids: tuple[int, ...]) -> bytes:
    """A stable chained hash (sha256, not Python's per-process salted hash())."""
    h = hashlib.sha256(parent_hash or b"")
    h.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    return h.digest()


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None          # set once the block is full and committed
    token_ids: tuple[int, ...] = ()    # the ids behind `hash`, to confirm a hit (never trust the hash alone)

    def reset(self) -> None:
        self.hash = None
        self.token_ids = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks: dict[int, Block] = {}          # every block allocated at least once
        self._next_unused = 0                         # blocks >= this were never allocated: the queue's head
        self._freed: OrderedDict[int, None] = OrderedDict()  # the rest of the free queue, oldest first
        self.hash_to_block: dict[bytes, int] = {}
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ---- sizes and stats -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._next_unused + len(self._freed)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some sequence."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        """Prefix-cache hits over lookups, in tokens. A lookup that the scheduler rolls back because the
        pool was full is counted again when it is retried."""
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def slot(self, seq: Sequence, position: int) -> int:
        """Index of the token at `position` in the flattened [num_blocks * block_size] pool."""
        return self.slots(seq, position, position + 1)[0]

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """slot(seq, p) for p in start..end-1 (the definition runner/inputs.build_inputs's numpy layout of a whole step
        follows; tests/test_engine.py checks one against the other)."""
        table, bs = seq.block_table, self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- one block, and the debugger's view of all of them ----------------------------------
    def block(self, block_id: int) -> Block:
        """A block's record (a blank one, not kept, for a block never allocated)."""
        assert 0 <= block_id < self.num_blocks, block_id
        return self._blocks.get(block_id) or Block(block_id)

    def is_free(self, block_id: int) -> bool:
        """Whether the block is in the free queue (unreferenced)."""
        return block_id >= self._next_unused or block_id in self._freed

    def is_cached(self, block_id: int) -> bool:
        block = self._blocks.get(block_id)
        return block is not None and block.hash is not None and self.hash_to_block.get(block.hash) == block_id

    def block_states(self) -> list[str]:
        """Per block: "used" (referenced), "cached" (free but reusable by a prefix hit) or "free"
        (a list over the whole pool: for the debugger's grid)."""
        states = ["free"] * self.num_blocks
        for block_id, block in self._blocks.items():
            states[block_id] = "used" if block.ref_count else "cached" if self.is_cached(block_id) else "free"
        return states

    def ref_counts(self) -> list[int]:
        counts = [0] * self.num_blocks
        for block_id, block in self._blocks.items():
            counts[block_id] = block.ref_count
        return counts

    # ---- prefix cache ----------------------------------------------------------------------
    def lookup_prefix(self, seq: Sequence) -> int:
        """Give a sequence with no blocks yet the cached blocks of its longest cached prefix.

        Looks up the sequence's full blocks of known tokens (the prompt, or for a preempted sequence
        the prompt plus its generated tokens), but never all of them: at least the last known token
        must be computed to produce logits, so the hit stops at the last full block boundary below
        num_tokens. Sets num_computed_tokens and num_cached_tokens to the hit length and returns it.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        self.prefix_query_tokens += seq.num_tokens
        bs = self.block_size
        parent = None
        hits = []
        for i in range((seq.num_tokens - 1) // bs):
            token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            parent = block_hash(parent, token_ids)
            block_id = self.hash_to_block.get(parent)
            if block_id is None or self._blocks[block_id].token_ids != token_ids:
                break
            hits.append(block_id)
        for block_id in hits:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._freed[block_id]  # a block with a hash was allocated before: it is not in the head
            block.ref_count += 1
        seq.block_table = hits
        seq.num_hashed_blocks = len(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * bs
        self.prefix_hit_tokens += seq.num_cached_tokens
        return seq.num_cached_tokens

    def commit(self, seq: Sequence) -> None:
        """Register every block of seq that has become full (all block_size tokens computed)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        # Blocks fill in order, so only those past the last registered one can be new (a long sequence
        # would otherwise walk its whole table every step).
        start = seq.num_hashed_blocks
        parent = self._blocks[seq.block_table[start - 1]].hash if start else None
        for i in range(start, seq.num_computed_tokens // bs):
            block = self._blocks[seq.block_table[i]]
            if block.hash is None:
                token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
                block.hash, block.token_ids = block_hash(parent, token_ids), token_ids
                # Two sequences may compute the same prefix at once: the first registered copy stays.
                self.hash_to_block.setdefault(block.hash, block.block_id)
            parent = block.hash
        seq.num_hashed_blocks = max(start, seq.num_computed_tokens // bs)

    # ---- allocation ------------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow seq.block_table to cover num_computed_tokens + num_new_tokens tokens.

        Returns False, changing nothing, when there are not enough free blocks."""
        num_tokens = seq.num_computed_tokens + num_new_tokens
        assert num_new_tokens > 0 and num_tokens <= seq.num_tokens
        missing = self.blocks_needed(num_tokens) - len(seq.block_table)
        if missing > self.num_free_blocks:
            return False
        for _ in range(missing):
            block = self._take_free_block()
            assert block.ref_count == 0
            if self.is_cached(block.block_id):  # evict: its old contents are about to be overwritten
                del self.hash_to_block[block.hash]
            block.reset()
            block.ref_count = 1
            seq.block_table.append(block.block_id)
        return True

    def _take_free_block(self) -> Block:
        """The free queue's head: the lowest never-allocated block (made now), else the longest-freed one."""
        if self._next_unused < self.num_blocks:
            block = self._blocks[self._next_unused] = Block(self._next_unused)
            self._next_unused += 1
            return block
        block_id, _ = self._freed.popitem(last=False)
        return self._blocks[block_id]

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks. Last blocks first, so they sit nearer the head and are evicted first."""
        for block_id in reversed(seq.block_table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0 and block_id not in self._freed
            if block.ref_count == 0:
                self._freed[block_id] = None
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0

    def check_invariants(self) -> None:
        """Over the blocks ever allocated (never-allocated ones have no state): O(blocks used so far)."""
        assert set(self._blocks) == set(range(self._next_unused)), "blocks are made in id order, once"
        for block in self._blocks.values():
            assert block.ref_count >= 0, block
            assert (block.ref_count == 0) == (block.block_id in self._freed), block
        for h, block_id in self.hash_to_block.items():
            assert self._blocks[block_id].hash == h
