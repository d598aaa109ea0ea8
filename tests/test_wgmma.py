"""wgmma.py's warpgroup product and gemm_wgmma against numpy: on the GPU (TINYVLLM_TEST_GPU=1, an sm_90 device) the
inline-PTX wgmma, in the simulator its twin (which reads the operands back through their descriptors)."""
import functools
import os

import ml_dtypes
import numpy as np
import pytest

from kernels_numba.common import SHARED_ALIGN, SIMULATOR, cuda, host_version, jit
from kernels_numba.gemm_wgmma import WgmmaTile, gemm_wgmma, gemm_wgmma_ref
from kernels_numba.wgmma import (ROUTE_ENV, WARPGROUP, decode_descriptor, fence_proxy_async, fragment_position,
                                 matrix_descriptor, matrix_descriptor_sw128, matrix_descriptor_sw128_mn, ptx_target,
                                 shared_address, sm90a_ptx, swizzle_128b, wgmma_bf16, wgmma_bf16_rs, wgmma_commit,
                                 wgmma_fence, wgmma_ref, wgmma_route, wgmma_wait_group)
from tests.helpers import poisoned


def _bf16_bits(rng, shape):
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint16)


def test_descriptor_fields_follow_the_ptx_isa():
    # PTX ISA 9.7.15.5.1.2: K-major, no swizzle, tf32 example: LBO 64 * 4 bytes encodes as 16, SBO 32 * 4 as 8;
    # the start address >> 4 in bits 0-13, LBO in 16-29, SBO in 32-45, swizzle 0 in 62-63.
    descriptor = int(host_version(matrix_descriptor)(np.uint32(0x1230), 64 * 4, 32 * 4))
    assert descriptor == 0x123 | 16 << 16 | 8 << 32


def test_sw128_descriptor_and_swizzle():
    # mode 1 (128-byte swizzle) in bits 62-63, SBO 1,024 bytes (encoded 64), LBO 16 bytes (encoded 1)
    sw128 = host_version(matrix_descriptor_sw128)
    assert int(sw128(np.uint32(0x2400))) == 0x240 | 1 << 16 | 64 << 32 | 1 << 62
    assert decode_descriptor(sw128(np.uint32(0x2400 + 32))) == (0x2420, 16, 1024, 1)
    # row r of an atom: its 16-byte chunks permuted by XOR with r (a permutation of the row's 8 chunks)
    for r in range(8):
        chunks = [swizzle_128b(r * 128 + c * 16) for c in range(8)]
        assert chunks == [r * 128 + (c ^ r) * 16 for c in range(8)]
    assert swizzle_128b(1024 + 3 * 128 + 5) == 1024 + 3 * 128 + (0 ^ 3) * 16 + 5


def test_fragment_position_is_figure_149():
    # Warp 1, lane 6 (g 1, t 2): d0, d1 at row 16 + 1, columns 4, 5; d2, d3 eight rows down; d4 the next 8 columns.
    thread = 32 + 6
    assert [fragment_position(thread, j) for j in range(6)] == [(17, 4), (17, 5), (25, 4), (25, 5), (17, 12), (17, 13)]


@functools.cache
def twice_kernel(n: int):
    """D = C + 2 A B.T in one warpgroup: A [64, 16] and B [n, 16] stored K-major in shared memory by plain stores
    (element (row, k) at [k // 8, row, k % 8]), C loaded into the accumulators and D stored back through the
    fragment layout (wgmma.fragment_position), two wgmmas in one group."""
    count = n // 2
    mma, wait = wgmma_bf16(n), wgmma_wait_group(0, count)

    @jit
    def kernel(a, b, c, d):
        a_tile = cuda.shared.array((2, 64, 8), np.uint16, alignment=SHARED_ALIGN)
        b_tile = cuda.shared.array((2, n, 8), np.uint16, alignment=SHARED_ALIGN)
        acc = cuda.local.array(count, np.float32)
        tid = cuda.threadIdx.x
        for i in range(tid, 64 * 16, WARPGROUP):
            a_tile[(i % 16) // 8, i // 16, i % 8] = a[i // 16, i % 16]
        for i in range(tid, n * 16, WARPGROUP):
            b_tile[(i % 16) // 8, i // 16, i % 8] = b[i // 16, i % 16]
        row0 = 16 * (tid // 32) + (tid % 32) // 4
        col0 = 2 * (tid % 4)
        for j in range(count):
            acc[j] = c[row0 + 8 * ((j // 2) % 2), col0 + 8 * (j // 4) + j % 2]
        fence_proxy_async()
        cuda.syncthreads()
        wgmma_fence()
        desc_a = matrix_descriptor(shared_address(a_tile, 0, 0, 0), 64 * 16, 128)
        desc_b = matrix_descriptor(shared_address(b_tile, 0, 0, 0), n * 16, 128)
        mma(acc, desc_a, desc_b)
        mma(acc, desc_a, desc_b)
        wgmma_commit()
        wait(acc)
        for j in range(count):
            d[row0 + 8 * ((j // 2) % 2), col0 + 8 * (j // 4) + j % 2] = acc[j]

    return kernel


@pytest.mark.parametrize("n", [64] if SIMULATOR else [8, 64, 128, 256])
def test_wgmma_twice_matches_numpy(rng, n):
    a, b = _bf16_bits(rng, (64, 16)), _bf16_bits(rng, (n, 16))
    c = rng.standard_normal((64, n)).astype(np.float32)
    d = poisoned((64, n), np.float32)
    twice_kernel(n)[1, WARPGROUP](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
    got = d.copy_to_host()
    assert not np.isnan(got).any(), "some outputs were never written"
    want = wgmma_ref(a, b, wgmma_ref(a, b, c))
    # two sums of 16 exact products each (float32 rounding, unit roundoff doubled) on top of C
    x64, w64 = (np.abs(v.view(ml_dtypes.bfloat16).astype(np.float64)) for v in (a, b))
    bound = 2 * 17 * 2.0**-23 * (np.abs(c) + 2 * x64 @ w64.T)
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"max err {err.max()}, worst err / bound {(err / bound).max()}"


def test_n_major_descriptor_fields():
    # N-major, 128-byte swizzle: LBO (the next 64 N) in bits 16-29, SBO 1,024 (the next 8 K), mode 1
    descriptor = host_version(matrix_descriptor_sw128_mn)(np.uint32(0x2400), 2048)
    assert decode_descriptor(descriptor) == (0x2400, 2048, 1024, 1)


@functools.cache
def register_a_kernel(n: int):
    """D = A B.T in one warpgroup with A from registers (each lane packs its mma.sync A fragment from a [64, 16]
    array of bits) and B [n, 16] stored N-major in the 128-byte swizzle (row k of slice s holds B[64 s .. 64 s + 63,
    k]; slices 16 rows apart: LBO 2,048 bytes), as prefill_wgmma's P @ V."""
    count, rows = n // 2, 16 * -(-n // 64)  # 16 K rows a slice of 64 N
    mma, wait = wgmma_bf16_rs(n), wgmma_wait_group(0, count)

    @jit
    def kernel(a, b, d):
        b_tile = cuda.shared.array((rows, 8, 8), np.uint16, alignment=None if SIMULATOR else 1024)
        acc = cuda.local.array(count, np.float32)
        tid = cuda.threadIdx.x
        for i in range(tid, n * 16, WARPGROUP):
            col, k = i // 16, i % 16
            row = 16 * (col // 64) + k
            b_tile[row, ((col % 64) // 8) ^ (row % 8), col % 8] = b[col, k]
        lane = tid % 32
        row0 = 16 * (tid // 32) + lane // 4
        col0 = 2 * (lane % 4)
        words = cuda.local.array(4, np.uint32)
        for w in range(4):
            r, c = row0 + 8 * (w % 2), col0 + 8 * (w // 2)
            words[w] = np.uint32(a[r, c]) | (np.uint32(a[r, c + 1]) << np.uint32(16))
        for j in range(count):
            acc[j] = np.float32(0.0)
        fence_proxy_async()
        cuda.syncthreads()
        wgmma_fence()
        mma(acc, words[0], words[1], words[2], words[3],
            matrix_descriptor_sw128_mn(shared_address(b_tile, 0, 0, 0), 16 * 128))
        wgmma_commit()
        wait(acc)
        for j in range(count):
            d[row0 + 8 * ((j // 2) % 2), col0 + 8 * (j // 4) + j % 2] = acc[j]

    return kernel


@pytest.mark.parametrize("n", [64, 128] if SIMULATOR else [16, 64, 128, 256])
def test_wgmma_with_a_in_registers_and_b_n_major(rng, n):
    a, b = _bf16_bits(rng, (64, 16)), _bf16_bits(rng, (n, 16))
    d = poisoned((64, n), np.float32)
    register_a_kernel(n)[1, WARPGROUP](cuda.to_device(a), cuda.to_device(b), d)
    got = d.copy_to_host()
    assert not np.isnan(got).any(), "some outputs were never written"
    x64, w64 = (np.abs(v.view(ml_dtypes.bfloat16).astype(np.float64)) for v in (a, b))
    bound = 16 * 2.0**-23 * (x64 @ w64.T)  # 16 exact products summed in float32
    err = np.abs(got.astype(np.float64) - wgmma_ref(a, b, np.zeros((64, n), np.float32)))
    assert (err <= bound + 1e-30).all(), f"max err {err.max()}, worst err / bound {(err / bound).max()}"


def _assert_within_bound(got, x_bits, w_bits):
    """gemm_tc's bound: |got - ref| <= K 2^-23 sum_k |x_k w_k| (float32 sums of exact bf16 products, the unit
    roundoff doubled in case the tensor core truncates); ref the float64 sums."""
    assert not np.isnan(got).any(), "some outputs were never written"
    x64, w64 = (np.abs(v.view(ml_dtypes.bfloat16).astype(np.float64)) for v in (x_bits, w_bits))
    bound = x_bits.shape[1] * 2.0**-23 * (x64 @ w64.T)
    err = np.abs(got.astype(np.float64) - gemm_wgmma_ref(x_bits, w_bits).astype(np.float64))
    assert (err <= bound + 1e-30).all(), f"max err {err.max()}, worst err / bound {(err / bound).max()}"


SIMULATOR_CASES = [
    (64, 32, 64, WgmmaTile(16, 1, 3, 2)),
    (40, 56, 24, WgmmaTile(16, 1, 3, 2)),   # M, N short of a tile; K ends inside a slice (copies past edges fill zeros)
    (150, 40, 200, WgmmaTile(16, 2, 4, 2)),  # two warpgroups a block, 2 x 3 blocks in groups, 4 slices over 4 stages
]
GPU_CASES = [
    (64, 64, 32, WgmmaTile(64, 1, 3)),
    (300, 200, 136, WgmmaTile(64, 2, 3)),      # partial tiles in M and N, K not a multiple of the slice
    (1000, 1000, 1032, WgmmaTile(128, 2, 4)),
    (257, 384, 2048, WgmmaTile(256, 2, 4, 2)),  # grouped order with a short last group
    (512, 256, 512, WgmmaTile(256, 1, 5)),
    (4096, 2048, 2048, WgmmaTile(256, 2, 4)),  # the 1B's o_proj at a 4,096-token prefill
]


@pytest.mark.parametrize("m, n, k, tile", SIMULATOR_CASES if SIMULATOR else GPU_CASES)
def test_gemm_wgmma_matches_numpy_within_the_bound(rng, m, n, k, tile):
    x_bits, w_bits = _bf16_bits(rng, (m, k)), _bf16_bits(rng, (n, k))
    out = poisoned((m, n), np.float32)
    got = gemm_wgmma(cuda.to_device(x_bits), cuda.to_device(w_bits), out, tile=tile)
    assert got is out
    _assert_within_bound(got.copy_to_host(), x_bits, w_bits)


def test_sm90a_ptx_rewrites_the_target_and_an_old_version():
    ptx = "//\n.version 7.8\n.target sm_90\n.address_size 64\n"
    rewritten = sm90a_ptx(ptx)
    assert ptx_target(rewritten) == ".target sm_90a"
    assert ".version 8.0\n" in rewritten and ".address_size 64" in rewritten
    assert ".version 8.5" in sm90a_ptx(ptx.replace("7.8", "8.5"))  # a newer version stays


def test_route_comes_from_the_environment():
    assert wgmma_route({}) == "numba"
    assert wgmma_route({ROUTE_ENV: "ptx"}) == "ptx"
    with pytest.raises(ValueError, match=ROUTE_ENV):
        wgmma_route({ROUTE_ENV: "cuda-c"})


@pytest.mark.skipif(SIMULATOR or os.environ.get(ROUTE_ENV) == "ptx", reason="the GPU's default route")
def test_gemm_wgmma_through_the_ptx_route(rng):
    x_bits, w_bits = _bf16_bits(rng, (130, 72)), _bf16_bits(rng, (200, 72))
    out = poisoned((130, 200), np.float32)
    gemm_wgmma(cuda.to_device(x_bits), cuda.to_device(w_bits), out, tile=WgmmaTile(128, 2, 3), route="ptx")
    _assert_within_bound(out.copy_to_host(), x_bits, w_bits)


@pytest.mark.parametrize("routes", ["", "numba,sm90"])
def test_the_smoke_script_names_a_bad_route_in_one_line(routes):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "scripts" / "wgmma_smoke.py"), "--routes", routes, "--offline"],
                          capture_output=True, text=True, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"), timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    message = f"--routes takes a comma-separated subset of numba,ptx, got {routes!r}"
    assert done.stderr.splitlines()[-1].endswith(message)


# ---- the same bits as gemm_tc, and gemm_tc's SwiGLU epilogue ----
# Both add each k16 step's 16 products to float32 accumulators in K order (on the GPU: measured identical at the
# 1B model's prefill shapes, scripts/wgmma_smoke.py), so a plan may take either for any rows and stay invariant.
SAME_BITS_CASES = [(40, 48, 136, WgmmaTile(16, 1, 3, 2))] if SIMULATOR else [
    (300, 200, 136, WgmmaTile(64, 2, 3)), (1000, 3072, 2048, WgmmaTile(256, 2, 4)),
    (77, 2048, 8192, WgmmaTile(128, 2, 5))]


@pytest.mark.parametrize("m, n, k, tile", SAME_BITS_CASES)
def test_gemm_wgmma_gives_gemm_tc_bits(rng, m, n, k, tile):
    from kernels_numba.gemm_tc import gemm_tc, tile_for
    x = rng.standard_normal((m, k)).astype(np.float32)  # float32 x: both round it to bf16 first
    w_bits = _bf16_bits(rng, (n, k))
    x_dev, w_dev = cuda.to_device(x), cuda.to_device(w_bits)
    got = gemm_wgmma(x_dev, w_dev, poisoned((m, n), np.float32), tile=tile).copy_to_host()
    tc_tile = SIMULATOR_TC_TILE if SIMULATOR else tile_for(m, n)
    np.testing.assert_array_equal(got, gemm_tc(x_dev, w_dev, tile=tc_tile).copy_to_host())


SIMULATOR_TC_TILE = None
if SIMULATOR:
    from kernels_numba.gemm_tc import TileShape
    SIMULATOR_TC_TILE = TileShape(16, 32, 32, 1, 1)


@pytest.mark.parametrize("m, intermediate, k, tile", [(21, 45, 72, WgmmaTile(16, 1, 3, 2))] if SIMULATOR else [
    (21, 45, 72, WgmmaTile(64, 2, 3)), (1030, 8192, 2048, WgmmaTile(256, 2, 4))])
def test_gemm_wgmma_swiglu_matches_ref_and_gemm_tc(rng, m, intermediate, k, tile):
    """I odd: the up half of W starts at an odd row; M and 2 I end in partial tiles."""
    from kernels_numba.epilogues import SwiGLUEpilogue
    from kernels_numba.gemm_wgmma import gemm_wgmma_fused
    from tests.test_gemm_tc import _assert_swiglu_within_bound, _swiglu_inputs, _swiglu_fused
    x, w_bits = _swiglu_inputs(rng, m, intermediate, k)
    out = poisoned((m, intermediate), np.uint16)
    result = gemm_wgmma_fused(cuda.to_device(x), cuda.to_device(w_bits), SwiGLUEpilogue(bf16=True), out=out,
                              tile=tile)
    assert result.out is out
    got = out.copy_to_host()
    columns = None if intermediate < 1000 else np.arange(0, intermediate, 97)  # (the float64 reference's cost)
    _assert_swiglu_within_bound(got, x, w_bits, columns)
    from kernels_numba.gemm_tc import tile_for
    np.testing.assert_array_equal(got, _swiglu_fused(x, w_bits, SIMULATOR_TC_TILE or tile_for(m, 2 * intermediate)))
