"""BlockManager: allocation, ref counts, LRU free queue, chained-hash prefix cache."""
import gc
import hashlib
import tracemalloc

import numpy as np
import pytest

from tinyvllm.engine import block_manager as bm_module
from tinyvllm.engine.block_manager import BlockManager
from tinyvllm.engine.sequence import Sequence, SequenceStatus


def seq_of(seq_id, token_ids, max_tokens=4):
    return Sequence(seq_id, list(token_ids), max_tokens)


def compute(bm, seq, num_new_tokens):
    """What a step does to a sequence's cache state: allocate, 'compute', commit full blocks."""
    assert bm.allocate(seq, num_new_tokens)
    seq.num_computed_tokens += num_new_tokens
    bm.commit(seq)
    bm.check_invariants()


def test_allocate_and_free_track_ref_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = seq_of(0, range(10, 21))  # 11 tokens -> 3 blocks, the last one partial
    assert bm.blocks_needed(11) == 3 and bm.blocks_needed(12) == 3 and bm.blocks_needed(13) == 4
    assert bm.allocate(seq, 11)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert [bm.ref_counts()[b] for b in seq.block_table] == [1, 1, 1]
    assert bm.num_free_blocks == 5 and bm.usage == pytest.approx(3 / 8)
    assert bm.block_states().count("used") == 3
    bm.check_invariants()

    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 8 and bm.usage == 0.0 and bm.ref_counts() == [0] * 8
    bm.check_invariants()


def test_allocate_grows_block_by_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = seq_of(0, range(5))
    compute(bm, seq, 3)
    assert len(seq.block_table) == 1
    compute(bm, seq, 2)  # positions 3, 4: crosses into a second block
    assert len(seq.block_table) == 2
    seq.token_ids += [7, 8, 9]
    compute(bm, seq, 3)  # positions 5..7 still fit the second block
    assert len(seq.block_table) == 2
    assert bm.slot(seq, 0) == seq.block_table[0] * 4 and bm.slot(seq, 6) == seq.block_table[1] * 4 + 2


def test_allocate_failure_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = seq_of(0, range(9)), seq_of(1, range(100, 105))
    assert bm.allocate(a, 9)
    assert not bm.allocate(b, 5)  # needs 2 blocks, 0 free
    assert b.block_table == [] and bm.num_free_blocks == 0
    bm.free(a)
    assert bm.allocate(b, 5) and len(b.block_table) == 2
    bm.check_invariants()


def test_prefix_hit_shares_full_blocks_across_sequences():
    bm = BlockManager(num_blocks=16, block_size=4)
    shared = [5, 6, 7, 8, 9, 10, 11, 12]               # two full blocks
    a = seq_of(0, shared + [1, 2, 3])                  # 11 tokens
    b = seq_of(1, shared + [40, 41, 42, 43, 44])       # 13 tokens
    assert bm.lookup_prefix(a) == 0
    compute(bm, a, a.num_tokens)

    assert bm.lookup_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert b.num_computed_tokens == b.num_cached_tokens == 8
    assert [bm.ref_counts()[x] for x in a.block_table] == [2, 2, 1]
    compute(bm, b, b.num_tokens - 8)
    assert set(b.block_table[2:]).isdisjoint(a.block_table)
    assert bm.prefix_query_tokens == 11 + 13 and bm.prefix_hit_tokens == 8
    assert bm.prefix_hit_rate == pytest.approx(8 / 24)

    bm.free(a)  # shared blocks stay referenced by b
    assert [bm.ref_counts()[x] for x in b.block_table[:2]] == [1, 1]
    bm.check_invariants()


def test_prefix_hit_reuses_cached_blocks_after_first_sequence_finished():
    bm = BlockManager(num_blocks=6, block_size=4)
    prompt = list(range(30, 39))                       # 9 tokens: two full blocks + 1
    a = seq_of(0, prompt)
    bm.lookup_prefix(a)
    compute(bm, a, 9)
    a_blocks = list(a.block_table)
    bm.free(a)
    states = bm.block_states()
    assert [states[x] for x in a_blocks] == ["cached", "cached", "free"]  # the partial block holds no hash

    b = seq_of(1, prompt)
    assert bm.lookup_prefix(b) == 8
    assert b.block_table == a_blocks[:2]
    assert not any(bm.is_free(x) for x in b.block_table)  # a hit takes a free block out of the queue
    assert bm.num_free_blocks == 4
    compute(bm, b, 1)
    bm.check_invariants()


def test_never_takes_the_whole_prompt_from_cache():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(50, 58))                       # exactly two full blocks
    a = seq_of(0, prompt)
    bm.lookup_prefix(a)
    compute(bm, a, 8)
    b = seq_of(1, prompt)
    assert bm.lookup_prefix(b) == 4                    # the last token must be computed for logits
    assert b.num_tokens - b.num_computed_tokens == 4
    c = seq_of(2, prompt + [99])
    assert bm.lookup_prefix(c) == 8


def test_commit_registers_only_full_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq_of(0, range(7))
    bm.lookup_prefix(a)
    compute(bm, a, 6)                                  # block 0 full, block 1 half computed
    assert bm.is_cached(a.block_table[0])
    assert bm.block(a.block_table[1]).hash is None
    assert len(bm.hash_to_block) == 1


def test_eviction_when_pool_is_full_takes_lru_and_last_blocks_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    prompt = list(range(60, 68))                       # two full blocks
    a = seq_of(0, prompt)
    bm.lookup_prefix(a)
    compute(bm, a, 8)
    first, last = a.block_table
    first_hash, last_hash = bm.block(first).hash, bm.block(last).hash
    bm.free(a)
    assert len(bm.hash_to_block) == 2

    c = seq_of(1, range(200, 212))                     # 3 blocks of new data: one cached block must go
    bm.lookup_prefix(c)
    compute(bm, c, 12)
    assert first not in c.block_table and last in c.block_table  # a's last block is evicted first
    assert bm.block_states()[first] == "cached" and bm.hash_to_block[first_hash] == first
    assert last_hash not in bm.hash_to_block and bm.block(last).token_ids != tuple(prompt[4:])

    b = seq_of(2, prompt + [1])
    assert bm.lookup_prefix(b) == 4 and b.block_table == [first]
    bm.check_invariants()


def test_hash_collision_is_rejected_by_token_check(monkeypatch):
    monkeypatch.setattr(bm_module, "block_hash", lambda parent, token_ids: b"collide")
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq_of(0, [1, 2, 3, 4, 5])
    bm.lookup_prefix(a)
    compute(bm, a, 5)
    assert bm.hash_to_block == {b"collide": a.block_table[0]}
    b = seq_of(1, [9, 9, 9, 9, 5])                     # same forced hash, different tokens
    assert bm.lookup_prefix(b) == 0 and b.block_table == []
    same = seq_of(2, [1, 2, 3, 4, 6])                  # equal tokens still hit
    assert bm.lookup_prefix(same) == 4


def test_block_hash_is_chained_and_stable():
    h1 = bm_module.block_hash(None, (1, 2, 3, 4))
    assert h1 == bm_module.block_hash(None, (1, 2, 3, 4))
    assert bm_module.block_hash(h1, (5, 6, 7, 8)) != bm_module.block_hash(None, (5, 6, 7, 8))
    # sha256 of the int32 little-endian ids: stable across processes, unlike hash()
    assert h1 == hashlib.sha256(np.array([1, 2, 3, 4], dtype="<i4").tobytes()).digest()


def test_prefix_caching_disabled_never_hits():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a, b = seq_of(0, range(9)), seq_of(1, range(9))
    bm.lookup_prefix(a)
    compute(bm, a, 9)
    assert bm.lookup_prefix(b) == 0
    bm.free(a)
    assert "cached" not in bm.block_states() and bm.prefix_hit_rate == 0.0


def test_free_of_unreferenced_block_asserts():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq_of(0, range(3))
    assert bm.allocate(a, 3)
    table = list(a.block_table)
    bm.free(a)
    a.block_table = table
    with pytest.raises(AssertionError):
        bm.free(a)


def test_sequence_state_for_the_debugger():
    s = seq_of(0, range(5), max_tokens=3)
    assert s.state == "waiting" and s.num_prompt_tokens == 5 and s.num_output_tokens == 0
    s.status = SequenceStatus.RUNNING
    assert s.state == "prefill"
    s.num_computed_tokens = 3
    assert s.state == "chunked"
    s.num_computed_tokens = 5
    s.token_ids.append(42)
    assert s.state == "decode" and s.output_token_ids == [42] and s.num_tokens == 6
    s.status, s.num_preemptions, s.num_computed_tokens = SequenceStatus.WAITING, 1, 0
    assert s.state == "preempted"
    s.status = SequenceStatus.FINISHED
    assert s.state == "finished" and s.is_finished


def test_never_allocated_blocks_come_first_in_id_order_then_freed_ones_oldest_first():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq_of(0, range(12))
    compute(bm, a, 12)
    assert a.block_table == [0, 1, 2]
    bm.free(a)                                          # freed last block first: the queue is 3, 4, 5, 2, 1, 0
    assert [bm.is_free(x) for x in range(6)] == [True] * 6 and bm.num_free_blocks == 6
    b = seq_of(1, range(100, 120))
    compute(bm, b, 20)
    assert b.block_table == [3, 4, 5, 2, 1]
    assert bm.ref_counts() == [0, 1, 1, 1, 1, 1] and bm.block_states()[0] == "cached"  # still holds its hash


def test_a_pool_of_ten_million_blocks_builds_nothing_per_block():
    # A pool sized from GPU memory may hold millions of blocks (the demo model got 9.1 million on an H200).
    # Building one Python object per block would take ~1 GB and seconds; the manager must build none up front:
    # measured as the memory constructing it allocates (a list of 10M pointers alone would be 80 MB).
    tracemalloc.start()
    try:
        bm = BlockManager(num_blocks=10_000_000, block_size=16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"constructing allocated {peak} bytes"
    assert bm.num_free_blocks == 10_000_000 and bm.usage == 0.0
    a = seq_of(0, range(40))
    bm.lookup_prefix(a)
    compute(bm, a, 40)                                  # 3 blocks; 2 full ones committed
    assert a.block_table == [0, 1, 2] and bm.num_free_blocks == 10_000_000 - 3
    assert sum(type(o) is bm_module.Block for o in gc.get_objects()) == 3
    bm.free(a)
    b = seq_of(1, list(range(32)) + [7])
    assert bm.lookup_prefix(b) == 32 and b.block_table == [0, 1]   # the freed blocks still hit
    bm.check_invariants()
