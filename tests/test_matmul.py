import contextlib

import numpy as np
import pytest

from kernels_numba.bf16 import bf16_to_f32_ref, f32_to_bf16_ref
from kernels_numba.common import cuda
from kernels_numba.epilogues import RMSNormPrologue, ResidualEpilogue, RopeKVEpilogue, SwiGLUEpilogue
from kernels_numba import matmul
from kernels_numba.matmul import (BLOCK_FEATURES, BLOCK_K, BLOCK_TOKENS, COALESCED_PASS_TOKENS, COALESCED_ROWS,
                                  GEMV_ROWS, MAX_GEMV_TOKENS, gemm, gemm_blocked, gemm_splits, gemv,
                                  gemv_coalesced, gemv_fused, linear,
                                  linear_kernel, linear_ref)
from kernels_numba.activation import silu_mul_ref, silu_ref
from kernels_numba.attention import write_kv_paged_ref
from kernels_numba.kv_dtype import kv_decode_ref, kv_encode_ref
from kernels_numba.rmsnorm import rmsnorm_ref
from kernels_numba.rope import rope_inv_freq, rope_qkv, rope_qkv_ref
from tests.helpers import poisoned

OUT_FEATURES = 45  # not a multiple of TILE (16), of a warp, nor of gemv_coalesced's rows per block
UNIT_ROUNDOFF = 2.0**-24


def _inputs(rng, num_tokens, in_features, out_features=OUT_FEATURES):
    x = rng.standard_normal((num_tokens, in_features)).astype(np.float32)
    w_bits = f32_to_bf16_ref(rng.standard_normal((out_features, in_features)).astype(np.float32))
    return x, w_bits


def _assert_close_to_ref(got, x, w_bits):
    """The classic dot-product error bound, so the tolerance holds for any summation order (and FMA).

    A float32 dot product of length K is within gamma_K * sum_k |x_k w_k| of the exact value
    (gamma_K = K u / (1 - K u), u = 2^-24; products of f32 and bf16 are exact in float64, so the float64
    reference is exact up to its own ~K 2^-53 error). The reference's final cast to float32 adds at most
    u |exact|. Two extra terms of gamma cover both. A wrong index or a missed tile is off by O(1).
    """
    want = linear_ref(x, w_bits)
    abs_dot = np.abs(x).astype(np.float64) @ np.abs(bf16_to_f32_ref(w_bits)).astype(np.float64).T
    terms = x.shape[1] + 2
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    assert not np.isnan(got).any(), "some outputs were never written"
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= gamma * abs_dot).all(), f"max err {err.max()}, bound {(gamma * abs_dot).min()}"


@pytest.mark.parametrize("num_tokens", [1, 3, MAX_GEMV_TOKENS])
@pytest.mark.parametrize("in_features", [67, 32])
def test_gemv_matches_ref(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemv(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


def test_gemv_rejects_too_many_tokens(rng):
    x, w_bits = _inputs(rng, MAX_GEMV_TOKENS + 1, 16)
    with pytest.raises(AssertionError):
        gemv(cuda.to_device(x), cuda.to_device(w_bits))


assert OUT_FEATURES % COALESCED_ROWS != 0 and OUT_FEATURES % GEMV_ROWS != 0  # partial row groups


# In the simulator a block is 4 threads stepping 16 words (32 elements) of K at a time: 64 is whole steps,
# 66 and 130 end in a partial step (odd word counts, 33 and 65).
@pytest.mark.parametrize("num_tokens", [1, 3, MAX_GEMV_TOKENS])
@pytest.mark.parametrize("in_features", [64, 66, 130])
def test_gemv_coalesced_matches_ref(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    assert got is out
    _assert_close_to_ref(out.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("threads", [8, 32])  # 32: one full warp per block, as each warp runs on the GPU
def test_gemv_coalesced_other_block_sizes(rng, threads):
    x, w_bits = _inputs(rng, 3, 130)
    out = poisoned((3, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out, threads=threads)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


# The variants the GPU sweep (scripts/sweep_gemv.py) tries: rows per block, loads in flight, 4 bf16 per load.
@pytest.mark.parametrize("rows, unroll, word_elements, in_features", [(1, 2, 2, 66), (4, 8, 2, 130),
                                                                        (2, 4, 4, 132), (8, 1, 4, 68)])
def test_gemv_coalesced_variants(rng, rows, unroll, word_elements, in_features):
    x, w_bits = _inputs(rng, 3, in_features)
    out = poisoned((3, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out, rows=rows, unroll=unroll,
                         word_elements=word_elements)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("kernel, num_tokens, in_features", [("gemv_coalesced", 2, 66), ("gemm_blocked", 9, 20)])
def test_reads_a_row_slice_of_a_bigger_weight(rng, kernel, num_tokens, in_features):
    """Fused projections hand linear row ranges of one weight: gemv_coalesced's word view and gemm_blocked's
    tiles must start at the slice."""
    x, w_bits = _inputs(rng, num_tokens, in_features)
    stacked = np.concatenate([f32_to_bf16_ref(rng.standard_normal((5, in_features)).astype(np.float32)), w_bits])
    launch = {"gemv_coalesced": gemv_coalesced, "gemm_blocked": gemm_blocked}[kernel]
    got = launch(cuda.to_device(x), cuda.to_device(stacked)[5:], out=poisoned((num_tokens, OUT_FEATURES), np.float32))
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


# Fused RMSNorm in front: one pass and several (11 tokens = 4 + 4 + 3), uint64 and uint32 words (66).
@pytest.mark.parametrize("num_tokens", [1, 3, 2 * COALESCED_PASS_TOKENS + 3])
@pytest.mark.parametrize("in_features", [64, 66])
def test_gemv_fused_rmsnorm_matches_rmsnorm_then_linear(rng, num_tokens, in_features):
    """Against linear_ref(rmsnorm_ref(h)). The kernel sums (h g) w and scales once at the end: the dot bound of
    _assert_close_to_ref with K + 4 terms (the h g products and the scale's own roundings) covers that, and
    the scale itself, from a differently ordered sum of h^2, is within gamma_K relatively of the reference's:
    twice the bound covers both. normed (the stage output) is rmsnorm's formula with that scale: within
    gamma_K + 4u of rmsnorm_ref, relatively."""
    eps = 1e-5
    h = (3 * rng.standard_normal((num_tokens, in_features))).astype(np.float32)
    gains = f32_to_bf16_ref((1 + 0.1 * rng.standard_normal(in_features)).astype(np.float32))
    _, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    normed = poisoned((num_tokens, in_features), np.float32)
    result = gemv_fused(cuda.to_device(h), cuda.to_device(w_bits), RMSNormPrologue(cuda.to_device(gains), eps, normed),
                        out=out)
    got, got_normed = result.out, result.normed
    assert got is out and got_normed is normed
    got, got_normed = got.copy_to_host(), got_normed.copy_to_host()
    assert not np.isnan(got).any() and not np.isnan(got_normed).any(), "some outputs were never written"
    x = rmsnorm_ref(h, gains, eps)
    gamma = (in_features + 4) * UNIT_ROUNDOFF / (1 - (in_features + 4) * UNIT_ROUNDOFF)
    abs_dot = np.abs(x).astype(np.float64) @ np.abs(bf16_to_f32_ref(w_bits)).astype(np.float64).T
    err = np.abs(got.astype(np.float64) - linear_ref(x, w_bits))
    assert (err <= 2 * gamma * abs_dot).all(), f"max err {err.max()}"
    assert (np.abs(got_normed - x) <= (gamma + 4 * UNIT_ROUNDOFF) * np.abs(x)).all()


@pytest.mark.parametrize("num_tokens", [1, 2 * COALESCED_PASS_TOKENS + 3])
def test_gemv_fused_rmsnorm_swiglu_matches_the_mlp_gate(rng, num_tokens):
    """[Wg; Wu] stacked, out = silu(x Wg) * (x Wu) with x = rmsnorm(h). Each dot product is within the bound
    above (e_g, e_u); silu's slope is below 1.1, so the gate moves silu by at most 1.1 e_g, the up row by e_u
    times |silu|; silu itself and the product add a few roundings (8 u of the result)."""
    eps, intermediate, in_features = 1e-5, 23, 64  # 23 outputs: a partial last block of gate/up pairs
    h = (3 * rng.standard_normal((num_tokens, in_features))).astype(np.float32)
    gains = f32_to_bf16_ref((1 + 0.1 * rng.standard_normal(in_features)).astype(np.float32))
    _, w_bits = _inputs(rng, num_tokens, in_features, out_features=2 * intermediate)
    out = poisoned((num_tokens, intermediate), np.float32)
    got = gemv_fused(cuda.to_device(h), cuda.to_device(w_bits), RMSNormPrologue(cuda.to_device(gains), eps),
                     SwiGLUEpilogue(), out=out).out
    assert got is out
    got = got.copy_to_host()
    assert not np.isnan(got).any(), "some outputs were never written"
    x = rmsnorm_ref(h, gains, eps)
    gate, up = linear_ref(x, w_bits[:intermediate]), linear_ref(x, w_bits[intermediate:])
    gamma = (in_features + 4) * UNIT_ROUNDOFF / (1 - (in_features + 4) * UNIT_ROUNDOFF)
    abs_w = np.abs(bf16_to_f32_ref(w_bits)).astype(np.float64)
    e_gate = 2 * gamma * (np.abs(x).astype(np.float64) @ abs_w[:intermediate].T)
    e_up = 2 * gamma * (np.abs(x).astype(np.float64) @ abs_w[intermediate:].T)
    want = silu_mul_ref(gate, up).astype(np.float64)
    silu_gate = np.abs(silu_ref(gate)).astype(np.float64)
    bound = 1.1 * e_gate * (np.abs(up) + e_up) + silu_gate * e_up + 8 * UNIT_ROUNDOFF * np.abs(want)
    err = np.abs(got - want)
    assert (err <= bound).all(), f"max err {err.max()}"


@pytest.mark.parametrize("num_tokens", [1, 2 * COALESCED_PASS_TOKENS + 3])
def test_gemv_fused_residual_adds_the_residual(rng, num_tokens):
    x, w_bits = _inputs(rng, num_tokens, 66)
    residual = rng.standard_normal((num_tokens, OUT_FEATURES)).astype(np.float32)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    summed = poisoned((num_tokens, OUT_FEATURES), np.float32)
    result = gemv_fused(cuda.to_device(x), cuda.to_device(w_bits),
                        epilogue=ResidualEpilogue(cuda.to_device(residual), summed), out=out)
    assert result.out is out and result.residual_out is summed
    got, got_summed = result.out.copy_to_host(), result.residual_out
    _assert_close_to_ref(got, x, w_bits)
    np.testing.assert_array_equal(got_summed.copy_to_host(), got + residual)  # one float32 add, as add_rmsnorm


# Both reductions of a block's partial sums: the warp shuffles run only on a GPU (TINYVLLM_TEST_GPU=1); 8 threads
# is a block narrower than a warp (shuffles among its own lanes), 64 two warps, 256 eight. The shared-memory
# tree runs at every width in the simulator too (256 simulated threads: ~3 s on the 2-core CI machine).
@pytest.mark.parametrize("warp_reduce", [False, True])
@pytest.mark.parametrize("threads", [8, 64, 256])
def test_gemv_coalesced_both_reductions(rng, warp_reduce, threads):
    if warp_reduce and matmul.SIMULATOR:
        pytest.skip("the simulator has no warp shuffles: the warp reduction runs on a GPU only")
    x, w_bits = _inputs(rng, 2, 130)
    out = poisoned((2, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out, threads=threads,
                         warp_reduce=warp_reduce).copy_to_host()
    _assert_close_to_ref(got, x, w_bits)
    again = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), threads=threads, warp_reduce=warp_reduce)
    np.testing.assert_array_equal(again.copy_to_host(), got)  # a fixed summation order: the same bits every time


def test_the_simulator_runs_the_tree():
    if matmul.SIMULATOR:
        assert not matmul.WARP_REDUCE
    with pytest.raises(AssertionError, match="no warp shuffles") if matmul.SIMULATOR else contextlib.nullcontext():
        matmul.gemv_coalesced_kernel(1, 64, 4, 2, 4, warp_reduce=True)


# gemv_fused with RMSNormPrologue and RopeKVEpilogue: GQA (4 q heads share 2 KV heads, Llama-3.2-1B's head_dim 64 scaled down to 16) over uint64
# words, 2 q heads / 1 KV head of 8 over uint32 words (K = 66), and head_dim 6, whose 3 pairs a head put a
# block's pairs (2, or 4 past 2 tokens) in two heads; 1 and 2 tokens in one pass, 3 in a pass of 4.
# Every token count has a slot of its own; 2 and 3 include a padding token (slot -1) whose K/V go nowhere.
SLOTS = {1: [5], 2: [-1, 9], 3: [13, -1, 2]}
POSITIONS = [4093, 17, 2047]


@pytest.mark.parametrize("kv_dtype", [np.float32, np.uint16])  # float32 or bf16 (uint16) pools
@pytest.mark.parametrize("num_tokens", [1, 2, 3])
@pytest.mark.parametrize("n_heads, n_kv_heads, head_dim, hidden", [(4, 2, 16, 64), (2, 1, 8, 66), (3, 1, 6, 64)])
def test_gemv_fused_rmsnorm_rope_matches_norm_linear_rope_and_the_pool_writes(rng, num_tokens, n_heads, n_kv_heads,
                                                                         head_dim, hidden, kv_dtype):
    """Against numpy: rmsnorm_ref -> linear_ref -> rope_qkv_ref -> write_kv_paged_ref. Each q|k|v dot product is
    within the norm-fused gemv's bound e (see test_gemv_fused_rmsnorm_matches_rmsnorm_then_linear); a rotated value
    x1 cos - x2 sin moves by at most e1 + e2 (|cos|, |sin| <= 1), plus rope's own cos/sin difference (rope
    tests' TOL: 1e-5 absolute and relative). v is copied: e alone. Against the unfused launches (RMSNorm-fused then
    rope_qkv with the pools, same launch shape): the same dot products and the same rotate_pair, so in the
    simulator every bit of q, k, v, normed and both pools is the same; on a GPU the rotation's multiply-adds may
    contract differently (an FMA rounds once instead of twice): within 4 u (|x1| + |x2|), and a bf16 pool's values
    then within one bf16 ulp (2^-8 relative) of each other. A bf16 pool holds exactly the rounded k and v returned."""
    eps, block_size, num_blocks = 1e-5, 4, 5
    width = (n_heads + 2 * n_kv_heads) * head_dim
    h = (3 * rng.standard_normal((num_tokens, hidden))).astype(np.float32)
    gains = f32_to_bf16_ref((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    _, w_bits = _inputs(rng, num_tokens, hidden, out_features=width)
    positions = np.array(POSITIONS[:num_tokens], dtype=np.int32)
    slots = np.array(SLOTS[num_tokens], dtype=np.int32)
    inv_freq = rope_inv_freq(head_dim, 500000.0, None)
    pool_shape = (num_blocks, block_size, n_kv_heads, head_dim)
    k_pool = kv_encode_ref(rng.standard_normal(pool_shape), kv_dtype)
    v_pool = kv_encode_ref(rng.standard_normal(pool_shape), kv_dtype)
    d_h, d_gains, d_w = cuda.to_device(h), cuda.to_device(gains), cuda.to_device(w_bits)
    d_positions, d_inv_freq, d_slots = cuda.to_device(positions), cuda.to_device(inv_freq), cuda.to_device(slots)
    d_k_pool, d_v_pool = cuda.to_device(k_pool), cuda.to_device(v_pool)
    q_shape, kv_shape = (num_tokens, n_heads, head_dim), (num_tokens, n_kv_heads, head_dim)
    outs = [poisoned(q_shape, np.float32), poisoned(kv_shape, np.float32), poisoned(kv_shape, np.float32),
            poisoned((num_tokens, hidden), np.float32)]
    result = gemv_fused(d_h, d_w, RMSNormPrologue(d_gains, eps, outs[3]), RopeKVEpilogue(
        d_positions, d_inv_freq, n_heads, n_kv_heads, head_dim, (d_k_pool, d_v_pool), d_slots, *outs[:3]))
    returned = (result.q, result.k, result.v, result.normed)
    assert all(got is want for got, want in zip(returned, outs)) and result.out is None
    q, k, v, normed = (a.copy_to_host() for a in returned)
    got_k_pool, got_v_pool = d_k_pool.copy_to_host(), d_v_pool.copy_to_host()
    for got in (q, k, v, normed):
        assert not np.isnan(got).any(), "some outputs were never written"

    x = rmsnorm_ref(h, gains, eps)
    qkv = linear_ref(x, w_bits)
    gamma = (hidden + 4) * UNIT_ROUNDOFF / (1 - (hidden + 4) * UNIT_ROUNDOFF)
    e = 2 * gamma * (np.abs(x).astype(np.float64) @ np.abs(bf16_to_f32_ref(w_bits)).astype(np.float64).T)
    want_q, want_k, want_v = rope_qkv_ref(qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim)
    q_cols, kv_cols = n_heads * head_dim, n_kv_heads * head_dim
    e_q, e_k, e_v = (e[:, :q_cols].reshape(q_shape), e[:, q_cols:q_cols + kv_cols].reshape(kv_shape),
                     e[:, q_cols + kv_cols:].reshape(kv_shape))
    half = head_dim // 2
    for got, want, err in ((q, want_q, e_q), (k, want_k, e_k)):
        pair_err = err[..., :half] + err[..., half:]  # e1 + e2, for both values of the pair
        bound = np.concatenate([pair_err, pair_err], axis=-1) + 1e-5 + 1e-5 * np.abs(want)
        assert (np.abs(got - want) <= bound).all(), f"max err {np.abs(got - want).max()}"
    assert (np.abs(v - want_v) <= e_v).all(), f"max err {np.abs(v - want_v).max()}"
    assert (np.abs(normed - x) <= (gamma + 4 * UNIT_ROUNDOFF) * np.abs(x)).all()
    want_k_pool, want_v_pool = write_kv_paged_ref(k, v, k_pool, v_pool, slots)  # the values it returned, at their
    np.testing.assert_array_equal(got_k_pool, want_k_pool)                      # slots; every other entry kept
    np.testing.assert_array_equal(got_v_pool, want_v_pool)

    d_k_pool, d_v_pool = cuda.to_device(k_pool), cuda.to_device(v_pool)
    unfused = gemv_fused(d_h, d_w, RMSNormPrologue(d_gains, eps))
    unfused_qkv, unfused_normed = unfused.out, unfused.normed
    unfused = rope_qkv(unfused_qkv, d_positions, d_inv_freq, n_heads, n_kv_heads, head_dim,
                       kv_pools=(d_k_pool, d_v_pool), slot_mapping=d_slots)
    unfused = [a.copy_to_host() for a in (*unfused, unfused_normed, d_k_pool, d_v_pool)]
    largest_pair = 2 * np.abs(unfused_qkv.copy_to_host()).max()  # >= |x1| + |x2| of every pair
    for got, want in zip((q, k, v, normed, got_k_pool, got_v_pool), unfused):
        if matmul.SIMULATOR:
            bits = [a.view(np.uint32) if a.dtype == np.float32 else a for a in (got, want)]  # bf16 pools: uint16
            np.testing.assert_array_equal(*bits)
        else:
            atol = (4 * UNIT_ROUNDOFF + (2.0**-8 if got.dtype == np.uint16 else 0)) * largest_pair
            np.testing.assert_allclose(kv_decode_ref(got), kv_decode_ref(want), rtol=0, atol=atol)


def test_gemv_fused_rmsnorm_rope_allocates_its_outputs(rng):
    n_heads, n_kv_heads, head_dim, hidden = 2, 1, 8, 64
    h = rng.standard_normal((1, hidden)).astype(np.float32)
    gains = f32_to_bf16_ref((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    _, w_bits = _inputs(rng, 1, hidden, out_features=(n_heads + 2 * n_kv_heads) * head_dim)
    pools = (cuda.to_device(np.ones((2, 4, n_kv_heads, head_dim), np.float32)),
             cuda.to_device(np.ones((2, 4, n_kv_heads, head_dim), np.float32)))
    result = gemv_fused(cuda.to_device(h), cuda.to_device(w_bits), RMSNormPrologue(cuda.to_device(gains), 1e-5),
                        RopeKVEpilogue(cuda.to_device(np.array([3], np.int32)),
                                       cuda.to_device(rope_inv_freq(head_dim, 10000.0, None)), n_heads, n_kv_heads,
                                       head_dim, pools, cuda.to_device(np.array([6], np.int32))))
    q, k, v, normed = result.q, result.k, result.v, result.normed
    assert (q.shape, k.shape, v.shape, normed.shape) == ((1, 2, 8), (1, 1, 8), (1, 1, 8), (1, hidden))
    np.testing.assert_array_equal(pools[0].copy_to_host()[1, 2], k.copy_to_host()[0])  # slot 6: block 1, offset 2
    np.testing.assert_array_equal(pools[1].copy_to_host()[1, 2], v.copy_to_host()[0])


def test_gemv_coalesced_rejects_odd_in_features(rng):
    x, w_bits = _inputs(rng, 2, 67)
    with pytest.raises(AssertionError):
        gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits))


# More tokens than one pass holds: whole passes (8 = 4 + 4) and a partial last pass (11 = 4 + 4 + 3).
@pytest.mark.parametrize("num_tokens", [2 * COALESCED_PASS_TOKENS, 2 * COALESCED_PASS_TOKENS + 3])
def test_gemv_coalesced_walks_many_tokens_in_passes(rng, num_tokens):
    x, w_bits = _inputs(rng, num_tokens, 66)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemv_coalesced(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("num_tokens", [1, 3, 8, 13])
@pytest.mark.parametrize("in_features", [67, 32])  # a partial last K tile, and exact tiles
def test_gemm_matches_ref(rng, num_tokens, in_features):
    x, w_bits = _inputs(rng, num_tokens, in_features)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = gemm(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


# A simulated gemm_blocked block is 128 threads (~0.3 s a block here), so the shapes stay at a few blocks
# and steps of K. in_features 40, 33 and 100 end in a partial K step (8, 1 and 4 of BLOCK_K = 16; 33 is
# odd); T = 70 and N = 70 need a second, mostly empty block; 64 x 64 x 32 is whole tiles only.
assert OUT_FEATURES < BLOCK_FEATURES == BLOCK_TOKENS == 64 and BLOCK_K == 16


@pytest.mark.parametrize("num_tokens, in_features, out_features", [
    (1, 40, OUT_FEATURES), (17, 40, OUT_FEATURES), (70, 40, OUT_FEATURES), (17, 33, 70), (64, 32, 64),
    (130, 100, 70)])
def test_gemm_blocked_matches_ref(rng, num_tokens, in_features, out_features):
    x, w_bits = _inputs(rng, num_tokens, in_features, out_features)
    out = poisoned((num_tokens, out_features), np.float32)
    got = gemm_blocked(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    assert got is out
    _assert_close_to_ref(out.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("splits, in_features", [(3, 100), (2, 33), (4, 40)])
def test_gemm_blocked_split_k_matches_ref(rng, splits, in_features):
    # 100 in 3 slices: 48 + 48 + 4 (k_per_split rounds up to BLOCK_K); 33 in 2: 32 + 1; 40 asked in 4 slices
    # of 16 is 3 (a slice never starts past K). T = 70 crosses a token tile, so each slice has two blocks.
    x, w_bits = _inputs(rng, 70, in_features)
    got = gemm_blocked(cuda.to_device(x), cuda.to_device(w_bits), out=poisoned((70, OUT_FEATURES), np.float32),
                       splits=splits)
    _assert_close_to_ref(got.copy_to_host(), x, w_bits)


def test_gemm_splits_fills_the_gpu_only_when_tiles_are_few():
    assert gemm_splits(4096, 2048, 16384) == 1  # 64 x 256 tiles already
    assert gemm_splits(256, 8192, 2048) == 4    # down_proj at a 256-decode: 4 x 32 tiles -> 512 blocks
    assert gemm_splits(256, 2048, 2048) == 4    # o_proj: slices of 512
    assert gemm_splits(1, 512, 64) == 2         # never a slice under MIN_SPLIT_K = 256


def test_linear_kernel_picks_gemm_blocked_for_prefill_on_a_gpu(monkeypatch):
    def linear_kernel_name(num_tokens, in_features, simulator=False):
        return linear_kernel(num_tokens, in_features, simulator)[0]
    assert linear_kernel_name(MAX_GEMV_TOKENS + 1, 64, simulator=True) == "gemv"  # the simulator: gemv in chunks
    # the GPU's limits (the simulator's MAX_GEMV_TOKENS is 32, which would leave no room between the two)
    monkeypatch.setattr(matmul, "MAX_GEMV_TOKENS", 8)
    monkeypatch.setattr(matmul, "MAX_COALESCED_TOKENS", 32)
    assert linear_kernel_name(8, 64) == "gemv_coalesced"
    assert linear_kernel_name(8, 63) == "gemv"             # odd K: no word view for gemv_coalesced
    assert linear_kernel_name(9, 64) == "gemv_coalesced"   # in passes of tokens
    assert linear_kernel_name(32, 64) == "gemv_coalesced"
    assert linear_kernel_name(33, 64) == "gemm_blocked"
    assert linear_kernel_name(9, 63) == "gemm_blocked"
    assert linear_kernel_name(512, 63) == "gemm_blocked"


def test_linear_runs_gemm_blocked_when_it_picks_it(rng, monkeypatch):
    monkeypatch.setattr(matmul, "SIMULATOR", False)  # linear's GPU choice, run in the simulator
    launched = []

    def counting_gemm_blocked(*args):
        launched.append(1)
        return gemm_blocked(*args)

    monkeypatch.setattr(matmul, "gemm_blocked", counting_gemm_blocked)
    x, w_bits = _inputs(rng, MAX_GEMV_TOKENS + 1, 23)  # odd in_features: past 8 tokens, gemm_blocked
    out = poisoned((MAX_GEMV_TOKENS + 1, OUT_FEATURES), np.float32)
    assert linear(cuda.to_device(x), cuda.to_device(w_bits), out=out) is out
    assert launched == [1]
    _assert_close_to_ref(out.copy_to_host(), x, w_bits)


@pytest.mark.parametrize("num_tokens", [1, 8, 13, MAX_GEMV_TOKENS + 5])  # the last one: gemv in two chunks
def test_linear_matches_ref_and_fills_given_out(rng, num_tokens):
    x, w_bits = _inputs(rng, num_tokens, 67)
    out = poisoned((num_tokens, OUT_FEATURES), np.float32)
    got = linear(cuda.to_device(x), cuda.to_device(w_bits), out=out)
    assert got is out
    _assert_close_to_ref(out.copy_to_host(), x, w_bits)


def test_coalesced_threads_is_the_widest_block_within_the_grid_budget(monkeypatch):
    monkeypatch.setattr(matmul, "SIMULATOR", False)  # the GPU rule (the simulator keeps its 4-thread blocks)
    budget = matmul.COALESCED_GRID_THREADS
    for row_groups in (1, 100, 512, 513, 768, 1024, 4096, 32064):
        threads = matmul.coalesced_threads(row_groups)
        assert threads in (64, 128, 256)
        assert threads == 64 or row_groups * threads <= budget
        assert threads == 256 or row_groups * threads * 2 > budget
