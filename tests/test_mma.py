"""mma.py's building blocks, each in a small kernel against numpy: on the GPU (TINYVLLM_TEST_GPU=1) the inline-PTX
intrinsics, in the simulator their Python twins (the warp's lanes meeting at the warp-collective ones)."""
import ml_dtypes
import numpy as np
import pytest

from kernels_numba.bf16 import f32_to_bf16_ref
from kernels_numba.common import SHARED_ALIGN, SIMULATOR, cdiv, cuda, jit
from kernels_numba.mma import (cp_async_16, cp_async_commit, cp_async_wait_all, cp_async_wait_group, exp2_approx,
                               ldmatrix_x4, ldmatrix_x4_trans, load_x4, mma_bf16_m16n8k16, mma_ref, pack_bf16x2,
                               pack_f32_bf16x2, shared_view, shfl_xor)
from tests.helpers import poisoned

WARPS = 2  # warps per block: each warp's lanes must meet their own warp, not the other's
POISON_U32 = np.uint32(0xDEADBEEF)


def _bf16_bits(rng, shape):
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint16)


@jit
def mma_twice_kernel(a, w, c, d):
    """Per warp: D = A @ B + (A @ B + C), B = W.T, fragments gathered by hand from global memory (the layout of
    mma.py's docstring); two mmas, so the second takes the first's D as its C."""
    warp = cuda.threadIdx.x // 32 + cuda.blockIdx.x * (cuda.blockDim.x // 32)
    lane = cuda.threadIdx.x % 32
    g = lane // 4
    t = lane % 4
    a0 = pack_bf16x2(a[warp, g, 2 * t], a[warp, g, 2 * t + 1])
    a1 = pack_bf16x2(a[warp, g + 8, 2 * t], a[warp, g + 8, 2 * t + 1])
    a2 = pack_bf16x2(a[warp, g, 2 * t + 8], a[warp, g, 2 * t + 9])
    a3 = pack_bf16x2(a[warp, g + 8, 2 * t + 8], a[warp, g + 8, 2 * t + 9])
    b0 = pack_bf16x2(w[warp, g, 2 * t], w[warp, g, 2 * t + 1])
    b1 = pack_bf16x2(w[warp, g, 2 * t + 8], w[warp, g, 2 * t + 9])
    d0, d1, d2, d3 = mma_bf16_m16n8k16(a0, a1, a2, a3, b0, b1, c[warp, g, 2 * t], c[warp, g, 2 * t + 1],
                                       c[warp, g + 8, 2 * t], c[warp, g + 8, 2 * t + 1])
    d0, d1, d2, d3 = mma_bf16_m16n8k16(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3)
    d[warp, g, 2 * t] = d0
    d[warp, g, 2 * t + 1] = d1
    d[warp, g + 8, 2 * t] = d2
    d[warp, g + 8, 2 * t + 1] = d3


def test_mma_matches_numpy(rng):
    """Each bf16 product is exact in float32 and each mma adds 17 terms (16 products and C): the float32 sum
    is within 17 u' (|C| + sum |a b|) of the exact one, u' = 2^-23 (twice the unit roundoff, in case the
    hardware truncates). Two chained mmas: within 2 x 17 u' (|C| + 2 sum |a b|)."""
    blocks, tiles = 2, 2 * WARPS
    a = _bf16_bits(rng, (tiles, 16, 16))
    w = _bf16_bits(rng, (tiles, 8, 16))  # B = W.T: the weight layout, [n][k]
    c = rng.standard_normal((tiles, 16, 8)).astype(np.float32)
    d = poisoned((tiles, 16, 8), np.float32)
    mma_twice_kernel[blocks, 32 * WARPS](cuda.to_device(a), cuda.to_device(w), cuda.to_device(c), d)
    got = d.copy_to_host()
    assert not np.isnan(got).any(), "some outputs were never written"
    a64 = a.view(ml_dtypes.bfloat16).astype(np.float64)
    b64 = w.view(ml_dtypes.bfloat16).astype(np.float64).transpose(0, 2, 1)
    want = c + 2 * a64 @ b64
    magnitude = np.abs(c) + 2 * np.abs(a64) @ np.abs(b64)
    assert (np.abs(got - want) <= 34 * 2.0**-23 * magnitude).all(), f"max err {np.abs(got - want).max()}"
    for i in range(tiles):  # the twin of one mma, chained
        np.testing.assert_allclose(got[i], mma_ref(a[i], w[i].T.copy(), mma_ref(a[i], w[i].T.copy(), c[i])),
                                   rtol=0, atol=34 * 2.0**-23 * magnitude[i].max())


@jit
def ldmatrix_kernel(a, w, a_regs, b_regs):
    """Both tiles into shared memory (stage 1 of two, rows padded to 24), then per lane the A pattern (lanes 0-15
    rows 0-15 at column 8, lanes 16-31 the same rows at column 16) and the B pattern (lanes 0-7 / 8-15 rows 0-7
    at column 8 / 16, lanes 16-23 / 24-31 rows 8-15 at 8 / 16)."""
    a_tile = cuda.shared.array((2, 16, 24), np.uint16, alignment=SHARED_ALIGN)  # 16-byte rows
    w_tile = cuda.shared.array((2, 16, 24), np.uint16, alignment=SHARED_ALIGN)
    tid = cuda.threadIdx.x
    lane = tid % 32
    for i in range(tid, 16 * 24, cuda.blockDim.x):
        a_tile[1, i // 24, i % 24] = a[i // 24, i % 24]
        w_tile[1, i // 24, i % 24] = w[i // 24, i % 24]
    cuda.syncthreads()
    warp = tid // 32
    r0, r1, r2, r3 = ldmatrix_x4(a_tile, 1, lane % 16, 8 + 8 * (lane // 16))
    a_regs[warp, lane, 0] = r0
    a_regs[warp, lane, 1] = r1
    a_regs[warp, lane, 2] = r2
    a_regs[warp, lane, 3] = r3
    r0, r1, r2, r3 = ldmatrix_x4(w_tile, 1, lane % 8 + 8 * (lane // 16), 8 + 8 * ((lane // 8) % 2))
    b_regs[warp, lane, 0] = r0
    b_regs[warp, lane, 1] = r1
    b_regs[warp, lane, 2] = r2
    b_regs[warp, lane, 3] = r3


def _packed(tile, row, col):
    return np.uint32(tile[row, col]) | (np.uint32(tile[row, col + 1]) << np.uint32(16))


def test_ldmatrix_x4_hands_each_lane_its_mma_fragments(rng):
    """A = a[:, 8:24] (16 x 16): lane 4g + t gets a0..a3 = A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..].
    W = w[:, 8:24] ([n][k]): b0, b1 of features 0-7 (W[g][2t..], W[g][2t+8..]) and of features 8-15."""
    a = _bf16_bits(rng, (16, 24))
    w = _bf16_bits(rng, (16, 24))
    a_regs = cuda.to_device(np.full((WARPS, 32, 4), POISON_U32))
    b_regs = cuda.to_device(np.full((WARPS, 32, 4), POISON_U32))
    ldmatrix_kernel[1, 32 * WARPS](cuda.to_device(a), cuda.to_device(w), a_regs, b_regs)
    got_a, got_b = a_regs.copy_to_host(), b_regs.copy_to_host()
    A, W = a[:, 8:], w[:, 8:]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        want_a = [_packed(A, g, 2 * t), _packed(A, g + 8, 2 * t), _packed(A, g, 2 * t + 8), _packed(A, g + 8, 2 * t + 8)]
        want_b = [_packed(W, g, 2 * t), _packed(W, g, 2 * t + 8), _packed(W, g + 8, 2 * t), _packed(W, g + 8, 2 * t + 8)]
        for warp in range(WARPS):
            np.testing.assert_array_equal(got_a[warp, lane], want_a, err_msg=f"A, lane {lane}")
            np.testing.assert_array_equal(got_b[warp, lane], want_b, err_msg=f"B, lane {lane}")


@jit
def ldmatrix_trans_and_shuffle_kernel(v, regs, shuffled):
    """ldmatrix_x4_trans from V stored [key][dim] (stage 0, rows padded to 24) with the A pattern of addresses
    (lanes 0-15 keys 0-15 at dim 8, lanes 16-31 the same keys at dim 16); then three shuffles of a per-lane value."""
    v_tile = cuda.shared.array((1, 16, 24), np.uint16, alignment=SHARED_ALIGN)
    tid = cuda.threadIdx.x
    lane = tid % 32
    warp = tid // 32
    for i in range(tid, 16 * 24, cuda.blockDim.x):
        v_tile[0, i // 24, i % 24] = v[i // 24, i % 24]
    cuda.syncthreads()
    r0, r1, r2, r3 = ldmatrix_x4_trans(v_tile, 0, lane % 16, 8 + 8 * (lane // 16))
    regs[warp, lane, 0] = r0
    regs[warp, lane, 1] = r1
    regs[warp, lane, 2] = r2
    regs[warp, lane, 3] = r3
    value = np.float32(100 * warp + 1.5 * lane)
    shuffled[warp, lane, 0] = shfl_xor(value, 1)
    shuffled[warp, lane, 1] = shfl_xor(value, 2)
    shuffled[warp, lane, 2] = shfl_xor(value, 17)


def test_ldmatrix_x4_trans_and_shfl_xor(rng):
    """V = v[:, 8:24] ([key][dim]) is B = V ([k][n]): lane 4g + t gets b0, b1 of dims 0-7 (V[2t..2t+1][g],
    V[2t+8..2t+9][g]) and of dims 8-15. shfl_xor(x, m): lane l gets lane l ^ m's x, within its own warp."""
    v = _bf16_bits(rng, (16, 24))
    regs = cuda.to_device(np.full((WARPS, 32, 4), POISON_U32))
    shuffled = poisoned((WARPS, 32, 3), np.float32)
    ldmatrix_trans_and_shuffle_kernel[1, 32 * WARPS](cuda.to_device(v), regs, shuffled)
    got, got_shuffled = regs.copy_to_host(), shuffled.copy_to_host()
    V = v[:, 8:]

    def column_pair(key, dim):
        return np.uint32(V[key, dim]) | (np.uint32(V[key + 1, dim]) << np.uint32(16))

    for lane in range(32):
        g, t = lane // 4, lane % 4
        want = [column_pair(2 * t, g), column_pair(2 * t + 8, g), column_pair(2 * t, 8 + g), column_pair(2 * t + 8, 8 + g)]
        for warp in range(WARPS):
            np.testing.assert_array_equal(got[warp, lane], want, err_msg=f"lane {lane}")
            want_shuffled = [100 * warp + 1.5 * (lane ^ m) for m in (1, 2, 17)]
            np.testing.assert_array_equal(got_shuffled[warp, lane], want_shuffled)


wait_one = cp_async_wait_group(1)


@jit
def cp_async_kernel(src, first, second):
    """32 threads copy src (R rows of 32 bf16) into stage 1 of a shared [2, 8, 40] array as 16-byte chunks,
    rows past R zero-filled; rows 0-3 in one group, rows 4-7 in a second. After waiting for all but one group,
    rows 0-3 must be there (`first`); after waiting for all, rows 4-7 (`second`)."""
    tile = cuda.shared.array((2, 8, 40), np.uint16, alignment=SHARED_ALIGN)
    tid = cuda.threadIdx.x
    rows = src.shape[0]
    for i in range(tid, 8 * 40, 32):  # garbage where the zero fill must land
        tile[1, i // 40, i % 40] = np.uint16(0xFFFF)
    cuda.syncthreads()
    for group in range(2):
        chunk = tid % 16  # 16 chunks: 4 rows x 4 chunks of 8 bf16 per group; threads 16-31 copy nothing
        row = 4 * group + chunk // 4
        col = 8 * (chunk % 4)
        if tid < 16:
            cp_async_16(tile, 1, row, col, src, min(row, rows - 1), col, 16 if row < rows else 0)
        cp_async_commit()
    wait_one()
    cuda.syncthreads()
    for i in range(tid, 4 * 32, 32):
        first[i // 32, i % 32] = tile[1, i // 32, i % 32]
    cp_async_wait_all()
    cuda.syncthreads()
    for i in range(tid, 4 * 32, 32):
        second[i // 32, i % 32] = tile[1, 4 + i // 32, i % 32]


def test_cp_async_copies_in_groups_and_zero_fills(rng):
    src = _bf16_bits(rng, (6, 32))  # rows 6 and 7 lie past the source: zeros
    first, second = poisoned((4, 32), np.uint16), poisoned((4, 32), np.uint16)
    cp_async_kernel[1, 32](cuda.to_device(src), first, second)
    np.testing.assert_array_equal(first.copy_to_host(), src[:4])
    want = np.zeros((4, 32), np.uint16)
    want[:2] = src[4:]
    np.testing.assert_array_equal(second.copy_to_host(), want)


@jit
def cp_async_lands_late_kernel(src, seen):
    """Thread 0 copies src's 8 bf16 into a tile holding 0xFFFF and records the tile after each step: issued,
    committed, waited for all but one group, waited for all."""
    tile = cuda.shared.array((1, 1, 8), np.uint16, alignment=SHARED_ALIGN)
    if cuda.threadIdx.x == 0:
        for e in range(8):
            tile[0, 0, e] = np.uint16(0xFFFF)
        cp_async_16(tile, 0, 0, 0, src, 0, 0, 16)
        for e in range(8):
            seen[0, e] = tile[0, 0, e]
        cp_async_commit()
        for e in range(8):
            seen[1, e] = tile[0, 0, e]
        wait_one()
        for e in range(8):
            seen[2, e] = tile[0, 0, e]
        cp_async_wait_all()
        for e in range(8):
            seen[3, e] = tile[0, 0, e]


@pytest.mark.skipif(not SIMULATOR, reason="on the GPU a copy may land any time before its wait")
def test_simulated_cp_async_lands_only_at_a_wait_that_covers_it(rng):
    # The latest moment the hardware may land a copy, so a kernel that reads a stage before waiting for it (or waits
    # for the wrong group) reads stale data in the simulator too (tests/test_prefill_tc.py's mutations).
    src = _bf16_bits(rng, (1, 8))
    seen = poisoned((4, 8), np.uint16)
    cp_async_lands_late_kernel[1, 32](cuda.to_device(src), seen)
    seen = seen.copy_to_host()
    np.testing.assert_array_equal(seen[:3], np.full((3, 8), 0xFFFF, np.uint16))
    np.testing.assert_array_equal(seen[3], src[0])


@jit
def load_x4_kernel(values, out):
    i = cuda.threadIdx.x
    rows, cols = values.shape
    if i < rows * (cols // 4):
        row = i // (cols // 4)
        col = 4 * (i % (cols // 4))
        v0, v1, v2, v3 = load_x4(values, row, col)
        out[row, col] = v0
        out[row, col + 1] = v1
        out[row, col + 2] = v2
        out[row, col + 3] = v3


@pytest.mark.parametrize("dtype", [np.float32, np.uint32])
def test_load_x4_reads_four_32_bit_values(rng, dtype):
    values = (rng.standard_normal((3, 8)) * 1000).astype(dtype)
    out = cuda.to_device(np.full((3, 8), np.nan, np.float32).view(dtype))
    load_x4_kernel[1, 32](cuda.to_device(values), out)
    np.testing.assert_array_equal(out.copy_to_host(), values)


@jit
def exp2_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = exp2_approx(x[i])


def test_exp2_approx_within_two_ulp_and_flushes_like_ex2(rng):
    # ex2.approx.ftz.f32: relative error about 2^-22 (tested: 2^-21); 2^-inf = 0, results below 2^-126 flush to 0
    # (the softmax's masked keys and far-below-the-max weights), 2^0 = 1 exactly (the row's max key).
    x = np.concatenate([rng.uniform(-30, 0, 200), rng.uniform(-126, 127, 200),
                        [0.0, -np.inf, -130.0, -149.0, 1.0, -1.0]]).astype(np.float32)
    out = poisoned(x.shape, np.float32)
    exp2_kernel[cdiv(x.size, 128), 128](cuda.to_device(x), out)
    got, want = out.copy_to_host().astype(np.float64), np.exp2(x.astype(np.float64))
    normal = want >= np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], want[normal], rtol=2.0**-21, atol=0)
    assert (got[~normal] == 0).all() and got[x == 0] == 1.0 and (~normal).sum() == 3


@jit
def pack_kernel(lo, hi, out):
    i = cuda.grid(1)
    if i < lo.size:
        out[i] = pack_f32_bf16x2(lo[i], hi[i])


def test_pack_f32_bf16x2_rounds_to_nearest_even_like_f32_to_bf16(rng):
    # cvt.rn.bf16x2.f32 against the software rounding bit for bit (NaN aside): random values of every magnitude,
    # halfway cases both ways (ties to even), +-0, +-inf, the largest float32 (rounds to inf), a denormal.
    words = rng.integers(0, 2**32, 600, dtype=np.uint64).astype(np.uint32)
    words = words[~np.isnan(words.view(np.float32))]
    ties = (rng.integers(0, 2**16, 40, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.finfo(np.float32).max, 1e-40, 1.0, 0.5], np.float32)
    values = np.concatenate([words.view(np.float32), ties.view(np.float32), special])
    values = values[~np.isnan(values)]
    lo, hi = values, rng.permutation(values)
    out = cuda.to_device(np.full(values.shape, 0xDEADBEEF, np.uint32))  # not a pair of the rounded values below
    pack_kernel[cdiv(values.size, 128), 128](cuda.to_device(lo), cuda.to_device(hi), out)
    want = f32_to_bf16_ref(lo).astype(np.uint32) | (f32_to_bf16_ref(hi).astype(np.uint32) << np.uint32(16))
    np.testing.assert_array_equal(out.copy_to_host(), want)


TILE_VIEW, ROWS_VIEW = shared_view((2, 3, 8)), shared_view((3, 8))
ROWS_START = 48  # elements: after the (2, 3, 8) tile, 96 bytes in (16-byte aligned)


@jit
def shared_views_kernel(tile_values, rows_values, flat_out):
    """Writes through two views of the dynamic shared array, then copies the flat array out."""
    smem = cuda.shared.array(0, np.uint16, alignment=SHARED_ALIGN)
    tile = TILE_VIEW(smem, 0)
    rows = ROWS_VIEW(smem, ROWS_START)
    tid = cuda.threadIdx.x
    for i in range(tid, 48, cuda.blockDim.x):
        tile[i // 24, (i // 8) % 3, i % 8] = tile_values[i // 24, (i // 8) % 3, i % 8]
    for i in range(tid, 24, cuda.blockDim.x):
        rows[i // 8, i % 8] = rows_values[i // 8, i % 8]
    cuda.syncthreads()
    for i in range(tid, flat_out.size, cuda.blockDim.x):
        flat_out[i] = smem[i]


def test_shared_view_carves_c_arrays_out_of_dynamic_shared_memory(rng):
    """shared_view's arrays are C-ordered at their element offset: the flat dynamic array holds the (2, 3, 8) tile
    then the (3, 8) rows, row by row (through launch_with_shared, the dynamic memory's size the 4th launch item)."""
    from kernels_numba.common import launch_with_shared
    tile = rng.integers(1, 2**16, (2, 3, 8)).astype(np.uint16)
    rows = rng.integers(1, 2**16, (3, 8)).astype(np.uint16)
    flat = poisoned(72, np.uint16)
    launch_with_shared(shared_views_kernel, 1, 32, 72 * 2, cuda.to_device(tile), cuda.to_device(rows), flat)
    np.testing.assert_array_equal(flat.copy_to_host(), np.concatenate([tile.ravel(), rows.ravel()]))
