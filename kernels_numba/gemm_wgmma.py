"""A plain GEMM on Hopper's wgmma: out = x @ W.T, bf16 in, float32 accumulation, float32 out.

    out[m, n] = sum_k x[m, k] w[n, k]        x_bits u16 [M, K], w_bits u16 [N, K] (bf16 bits), out f32 [M, N]

One warpgroup (128 threads) per block owns a 64 x block_n tile of out (tokens along the grid's y, features along
its x), its accumulators in registers (block_n / 2 floats a thread, wgmma.py's fragment layout). The block walks K
a block_k slice at a time through `stages` shared buffers: every thread issues cp.async copies of 16 bytes (8 bf16
of one row) of the next slices of x and W (zeros past M, N and K) while the wgmmas run on the current one. Each
slice is stored K-major without swizzle, [block_k / 8, rows, 8] (wgmma.py: a 16-byte chunk of a row is one row of
a core matrix; SBO 128 bytes, LBO rows * 16 bytes), and multiplied by block_k / 16 wgmma.mma_async m64n{block_n}k16,
each reading A (64 rows of x) and B (block_n rows of W, K-major: B's columns) through two descriptors.

Per slice: wait for its copies, fence.proxy.async (the copies are generic-proxy writes the wgmma reads through the
async proxy), syncthreads, issue the next slice's copies, wgmma.fence, the wgmmas, commit, wait for them (the next
iteration's copies overwrite the stage the last wgmmas read only after everyone's wait and the barrier). The wgmmas
of a slice therefore do not overlap the next slice's: a kernel for correctness, not speed (a tuned one adds
swizzled layouts, TMA, keeping a wgmma group in flight, two consumer warpgroups).

Error: as gemm_tc (its docstring): each bf16 product is exact in float32 and the sum of K of them is float32, so
|out - ref| <= K 2^-23 sum_k |x_k w_k| with ref the float64 sum (the unit roundoff doubled in case the tensor core
truncates). In the simulator the kernel runs on wgmma.py's twins (128 simulated threads a block): small shapes.
"""
from dataclasses import dataclass
import functools

import numpy as np

from .common import SHARED_ALIGN, cdiv, cuda, device_empty, jit, launch_with_shared, SIMULATOR
from .mma import cp_async_16, cp_async_commit, cp_async_wait_group, shared_view
from .wgmma import (CORE_MATRIX_BYTES, CORE_ROW_BYTES, WARPGROUP, WGMMA_K, check_n, fence_proxy_async,
                    compile_through_ptx_rewrite, matrix_descriptor, shared_address, wgmma_bf16, wgmma_commit, wgmma_fence,
                    wgmma_route, wgmma_wait_group)

BLOCK_M = 64  # one m64 wgmma a block
CHUNK = 8     # bf16 per 16-byte copy: one row of a core matrix


@dataclass(frozen=True)
class WgmmaTile:
    block_n: int = 128  # output features per block: the wgmma's N (block_n / 2 accumulators a thread)
    block_k: int = 64   # K per shared stage: block_k / 16 wgmmas a slice
    stages: int = 2     # shared buffers: copies of slice k + stages - 1 overlap the wgmmas on slice k

    def shared_bytes(self) -> int:
        return self.stages * (BLOCK_M + self.block_n) * self.block_k * 2

    def check(self) -> None:
        check_n(self.block_n)
        assert self.block_k % WGMMA_K == 0 and self.stages >= 2, self
        assert self.shared_bytes() <= 227 * 1024, f"{self}: {self.shared_bytes()} B of shared memory, over 227 KB"


DEFAULT_TILE = WgmmaTile()
SIMULATOR_TILE = WgmmaTile(64, 16, 2)


@functools.cache
def gemm_wgmma_kernel(tile: WgmmaTile, route: str = "numba"):
    """The kernel for one tile (every size a compile-time constant). One per route: route "ptx" compiles its
    overloads from rewritten PTX (wgmma.compile_through_ptx_rewrite), so they must not be numba's plain ones."""
    tile.check()
    bn, bk, stages = tile.block_n, tile.block_k, tile.stages
    chunks_per_row = bk // CHUNK
    a_chunks, b_chunks = BLOCK_M * chunks_per_row, bn * chunks_per_row
    accumulators = bn // 2
    k_steps = bk // WGMMA_K
    a_leading, b_leading = BLOCK_M * CORE_ROW_BYTES, bn * CORE_ROW_BYTES  # the next 8 K: all the tile's rows on
    stride = CORE_MATRIX_BYTES  # the next 8 rows
    # A stage is [block_k / 8, rows, 8] bf16, kept as [stages, block_k / 8 * rows, 8] (3-D for cp_async_16)
    a_view = shared_view((stages, chunks_per_row * BLOCK_M, CHUNK))
    b_view = shared_view((stages, chunks_per_row * bn, CHUNK))
    b_start = stages * chunks_per_row * BLOCK_M * CHUNK  # bf16 into the dynamic array: a multiple of 128 bytes
    mma = wgmma_bf16(bn)
    wait_mma = wgmma_wait_group(0, accumulators)
    wait_copies = cp_async_wait_group(stages - 2)

    @jit(device=True)
    def copy_slice(x, w, a_tile, b_tile, stage, k0, m0, n0, tid):
        """This thread's 16-byte copies of x[m0:m0+64, k0:k0+bk] and W[n0:n0+bn, k0:k0+bk] into `stage`: chunk q is
        row q // chunks_per_row, K chunk q % chunks_per_row (a warp reads whole 16-byte runs of a row: coalesced)."""
        num_tokens, in_features = x.shape
        out_features = w.shape[0]
        for q in range(tid, a_chunks, WARPGROUP):
            row, kc = q // chunks_per_row, q % chunks_per_row
            k = k0 + kc * CHUNK
            valid = m0 + row < num_tokens and k < in_features
            cp_async_16(a_tile, stage, kc * BLOCK_M + row, 0, x, m0 + row if valid else 0, k if valid else 0,
                        16 if valid else 0)
        for q in range(tid, b_chunks, WARPGROUP):
            row, kc = q // chunks_per_row, q % chunks_per_row
            k = k0 + kc * CHUNK
            valid = n0 + row < out_features and k < in_features
            cp_async_16(b_tile, stage, kc * bn + row, 0, w, n0 + row if valid else 0, k if valid else 0,
                        16 if valid else 0)

    # Not cached on disk: the two routes' kernels have the same cache key (the route is not in the closure).
    @jit(cache=False)
    def kernel(x, w, out):
        smem = cuda.shared.array(0, np.uint16, alignment=SHARED_ALIGN)  # dynamic: tile.shared_bytes() at launch
        a_tile = a_view(smem, 0)
        b_tile = b_view(smem, b_start)
        acc = cuda.local.array(accumulators, np.float32)
        for j in range(accumulators):
            acc[j] = np.float32(0.0)
        num_tokens, in_features = x.shape
        out_features = w.shape[0]
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.y * BLOCK_M
        n0 = cuda.blockIdx.x * bn
        k_slices = (in_features + bk - 1) // bk
        for s in range(stages - 1):
            if s < k_slices:
                copy_slice(x, w, a_tile, b_tile, s, s * bk, m0, n0, tid)
            cp_async_commit()
        for kt in range(k_slices):
            wait_copies()
            fence_proxy_async()  # this thread's copies, visible to the async proxy the wgmma reads through
            cuda.syncthreads()   # everyone's slice kt is in; the stage slice kt - 1 used is free (its wgmmas waited)
            if kt + stages - 1 < k_slices:
                copy_slice(x, w, a_tile, b_tile, (kt + stages - 1) % stages, (kt + stages - 1) * bk, m0, n0, tid)
            cp_async_commit()  # (an empty group at the end keeps the wait count uniform)
            stage = kt % stages
            wgmma_fence()
            for ks in range(k_steps):
                desc_a = matrix_descriptor(shared_address(a_tile, stage, 2 * ks * BLOCK_M, 0), a_leading, stride)
                desc_b = matrix_descriptor(shared_address(b_tile, stage, 2 * ks * bn, 0), b_leading, stride)
                mma(acc, desc_a, desc_b)
            wgmma_commit()
            wait_mma(acc)
        # accumulator j of thread (warp, lane): row 16 warp + lane // 4 + 8 ((j // 2) % 2),
        # column 8 (j // 4) + 2 (lane % 4) + j % 2 (wgmma.fragment_position)
        row0 = m0 + 16 * (tid // 32) + (tid % 32) // 4
        col0 = n0 + 2 * (tid % 4)
        for j in range(accumulators):
            row = row0 + 8 * ((j // 2) % 2)
            col = col0 + 8 * (j // 4) + j % 2
            if row < num_tokens and col < out_features:
                out[row, col] = acc[j]

    return kernel


def gemm_wgmma(x_bits, w_bits, out=None, tile: WgmmaTile | None = None, route: str | None = None):
    """out = x @ W.T on wgmma (x_bits uint16 [M, K] and w_bits uint16 [N, K], bf16 bits, C-contiguous; K a multiple
    of 8: 16-byte copies). `route`: how the kernel gets its sm_90a code (wgmma.py; TINYVLLM_WGMMA_ROUTE unless given;
    the simulator ignores it). Returns out (float32 [M, N])."""
    tile = tile or (SIMULATOR_TILE if SIMULATOR else DEFAULT_TILE)
    route = route or wgmma_route()
    assert x_bits.ndim == 2 and w_bits.ndim == 2 and x_bits.dtype == np.uint16 and w_bits.dtype == np.uint16, (
        f"gemm_wgmma takes bf16 bits (uint16 [M, K] and [N, K]), got {x_bits.dtype} {x_bits.shape} and "
        f"{w_bits.dtype} {w_bits.shape}")
    num_tokens, in_features = x_bits.shape
    out_features = w_bits.shape[0]
    assert w_bits.shape[1] == in_features, f"x is [M, {in_features}] but W is {w_bits.shape}: K differs"
    assert in_features % CHUNK == 0, f"gemm_wgmma copies 8 bf16 at a time: K {in_features} is not a multiple of 8"
    assert x_bits.is_c_contiguous() and w_bits.is_c_contiguous(), "gemm_wgmma reads C-contiguous x and W"
    out = device_empty((num_tokens, out_features), np.float32) if out is None else out
    assert out.shape == (num_tokens, out_features) and out.dtype == np.float32, (out.shape, out.dtype)
    if num_tokens == 0 or out_features == 0:
        return out
    kernel = gemm_wgmma_kernel(tile, "numba" if SIMULATOR else route)
    args = (x_bits, w_bits, out)
    if route == "ptx" and not SIMULATOR:
        compile_through_ptx_rewrite(kernel, args)
    grid = (cdiv(out_features, tile.block_n), cdiv(num_tokens, BLOCK_M))
    launch_with_shared(kernel, grid, WARPGROUP, tile.shared_bytes(), *args)
    return out


def gemm_wgmma_ref(x_bits: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """numpy twin: the bf16 inputs decoded, float64 sums, float32 out."""
    import ml_dtypes
    x64 = x_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    w64 = w_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return (x64 @ w64.T).astype(np.float32)
