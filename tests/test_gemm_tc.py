"""gemm_tc (tensor-core GEMM) against numpy float64 on the bf16-rounded inputs, within its stated error bound.

In the simulator the kernel runs on mma.py's twins with small tiles (a simulated lane is a Python thread);
on a GPU (TINYVLLM_TEST_GPU=1) also at the GPU tile and every projection shape of the models tinyvllm runs."""
import functools

import ml_dtypes
import numpy as np
import pytest

from kernels_numba.common import SIMULATOR, cuda
from kernels_numba.epilogues import ResidualEpilogue, SwiGLUEpilogue
from kernels_numba.gemm_tc import (DEFAULT_TILE, TileShape, gemm_tc, gemm_tc_fused, gemm_tc_ref, to_bf16_rows,
                                   gemm_tc_kernel)
from kernels_numba.activation import silu_mul_gate_up
from tests.helpers import POISON_U16, poisoned

SMALL = TileShape(32, 32, 32, 1, 2)  # 2 warps of 32 x 16: the simulator's tile


def _inputs(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_bits = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16).view(np.uint16)
    return x, w_bits


def _assert_within_bound(got, x, w_bits, columns=None):
    """|got - ref| <= K 2^-23 sum_k |x_k w_k|: gemm_tc's stated bound (float32 sums of exact bf16 products,
    the unit roundoff doubled in case the tensor core truncates). ref: float64 sums of the bf16-rounded inputs."""
    assert not np.isnan(got).any(), "some outputs were never written"
    if columns is not None:
        w_bits = w_bits[columns]
        got = got[:, columns]
    x64 = np.abs(x.astype(ml_dtypes.bfloat16).astype(np.float64))
    w64 = np.abs(w_bits.view(ml_dtypes.bfloat16).astype(np.float64))
    bound = x.shape[1] * 2.0**-23 * (x64 @ w64.T)
    err = np.abs(got.astype(np.float64) - gemm_tc_ref(x, w_bits).astype(np.float64))
    assert (err <= bound + 1e-30).all(), f"max err {err.max()}, worst err / bound {(err / bound).max()}"


# Partial tiles in M and N with 2 K slices; K ending in a partial slice (the copies past K fill zeros); 3 stages
# (cp.async.wait_group 1) over 3 slices; more threads than copies (bk 16: 32 copies of x for 64 threads).
@pytest.mark.parametrize("m, n, k, tile", [
    (40, 72, 64, SMALL),
    (17, 40, 48, SMALL),
    (33, 32, 96, TileShape(32, 32, 32, 1, 2, stages=3)),
    (5, 24, 32, TileShape(16, 32, 16, 1, 2)),
])
def test_gemm_tc_matches_ref_within_the_bound(rng, m, n, k, tile):
    x, w_bits = _inputs(rng, m, n, k)
    out = poisoned((m, n), np.float32)
    got = gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), out, tile=tile)
    assert got is out
    _assert_within_bound(got.copy_to_host(), x, w_bits)


def test_gemm_tc_at_the_gpu_tile(rng):
    # The GPU's tile (128 x 128, 4 warps of 64 x 64: 4 x 8 mma tiles a warp) once, with partial tiles.
    x, w_bits = _inputs(rng, 100, 120, 64)
    out = poisoned((100, 120), np.float32)
    _assert_within_bound(gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), out).copy_to_host(), x, w_bits)


def test_gemm_tc_takes_bf16_bits_and_a_residual(rng):
    x, w_bits = _inputs(rng, 20, 40, 64)
    x_bits = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    residual = rng.standard_normal((20, 40)).astype(np.float32)
    out, summed = poisoned((20, 40), np.float32), poisoned((20, 40), np.float32)
    result = gemm_tc_fused(cuda.to_device(x_bits), cuda.to_device(w_bits),
                           ResidualEpilogue(cuda.to_device(residual), summed), out=out, tile=SMALL)
    assert result.out is out and result.residual_out is summed
    got = out.copy_to_host()
    _assert_within_bound(got, x, w_bits)
    np.testing.assert_array_equal(summed.copy_to_host(), got + residual)  # one float32 add


# ---- gate|up with the SwiGLU gate behind (SwiGLUEpilogue(bf16=True)) ----
SILU_SLOPE = 1.0999  # max |silu'(g)| (at g ~ 2.4): how far an error in the gate moves silu(gate)


def _swiglu_inputs(rng, m, intermediate, k):
    """x [m, k] and the stacked [Wg; Wu] ([2 I, k] bf16 bits): gate rows first, then up."""
    return _inputs(rng, m, 2 * intermediate, k)


def _swiglu_fused(x, w_bits, tile):
    out = poisoned((x.shape[0], w_bits.shape[0] // 2), np.uint16)
    result = gemm_tc_fused(cuda.to_device(x), cuda.to_device(w_bits), SwiGLUEpilogue(bf16=True), tile=tile, out=out)
    assert result.out is out
    return out.copy_to_host()


def _swiglu_unfused(x, w_bits, tile):
    """What the fast plan ran before: gemm_tc's float32 gate|up, then silu_mul_gate_up(bf16=True)."""
    gate_up = gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), tile=tile)
    return silu_mul_gate_up(gate_up, bf16=True).copy_to_host()


def _assert_swiglu_within_bound(got_bits, x, w_bits, columns=None):
    """bf16(silu(gate) * up) against the float64 reference on the bf16-rounded inputs, |got - want| <= 2^-8 |want|
    (bf16's rounding: <= 2^-9 of the value, doubled for float32's exp, divide and multiply before it, ~2^-22)
    + SILU_SLOPE e_g |up| + |silu(gate)| e_u + e_g e_u, with e_g, e_u gemm_tc's bound on gate and up
    (K 2^-23 sum_k |x_k w_k|) that their float32 sums may be off by."""
    assert (got_bits != POISON_U16).all(), "some outputs were never written"
    intermediate = w_bits.shape[0] // 2
    columns = np.arange(intermediate) if columns is None else columns
    gate_w, up_w = w_bits[columns], w_bits[intermediate + columns]
    x64 = x.astype(ml_dtypes.bfloat16).astype(np.float64)

    def dot_and_bound(w):
        w64 = w.view(ml_dtypes.bfloat16).astype(np.float64)
        return x64 @ w64.T, x.shape[1] * 2.0**-23 * (np.abs(x64) @ np.abs(w64.T))
    gate, gate_err = dot_and_bound(gate_w)
    up, up_err = dot_and_bound(up_w)
    silu = gate / (1.0 + np.exp(-gate))
    want = silu * up
    bound = 2.0**-8 * np.abs(want) + SILU_SLOPE * gate_err * np.abs(up) + np.abs(silu) * up_err + gate_err * up_err
    got = got_bits[:, columns].view(ml_dtypes.bfloat16).astype(np.float64)
    err = np.abs(got - want)
    assert (err <= bound + 1e-30).all(), f"max err {err.max()}, worst err / bound {(err / (bound + 1e-30)).max()}"


# M and 2 I ending in partial tiles (I 45: the up half starts at an odd row of W), K in a partial slice, 3 stages;
# SIMULATOR_TILE (one warp of 16 x 32: the fast plan's tile in the simulator) and the GPU's LARGE_TILE (4 warps).
@pytest.mark.parametrize("m, intermediate, k, tile", [
    (37, 44, 80, SMALL),
    (21, 45, 64, TileShape(32, 32, 32, 1, 2, stages=3)),
    (19, 40, 96, TileShape(16, 32, 32, 1, 1)),
])
def test_gemm_tc_swiglu_matches_ref_and_the_unfused_pair(rng, m, intermediate, k, tile):
    """Within the bound of the float64 reference, and bit for bit gemm_tc then silu_mul_gate_up(bf16=True): the
    same float32 gate and up (each output's products summed in the same mma order) through the same gate arithmetic."""
    x, w_bits = _swiglu_inputs(rng, m, intermediate, k)
    got = _swiglu_fused(x, w_bits, tile)
    _assert_swiglu_within_bound(got, x, w_bits)
    np.testing.assert_array_equal(got, _swiglu_unfused(x, w_bits, tile))


def test_gemm_tc_swiglu_at_the_gpu_tile(rng):
    # LARGE_TILE (128 x 128 x 64, 4 warps, 16 W rows a copy round) once in the simulator: one block, partial in M
    # (2 I = 128, a whole block: the partial 2 I edge is the small tiles' case above; two blocks took 38 s here)
    from kernels_numba.gemm_tc import LARGE_TILE
    x, w_bits = _swiglu_inputs(rng, 20, 64, 64)
    got = _swiglu_fused(x, w_bits, LARGE_TILE)
    _assert_swiglu_within_bound(got, x, w_bits)
    np.testing.assert_array_equal(got, _swiglu_unfused(x, w_bits, LARGE_TILE))


@pytest.mark.skipif(SIMULATOR, reason="GPU only (TINYVLLM_TEST_GPU=1): full-size shapes")
@pytest.mark.parametrize("intermediate, k", [(8192, 2048), (1536, 576), (128, 64)])
@pytest.mark.parametrize("m", [3, 77, 300, 1024])
def test_gemm_tc_swiglu_model_shapes_on_the_gpu(rng, m, intermediate, k):
    """Llama-3.2-1B's, SmolLM2-135M's and the demo model's gate|up at the plan's tile: bit for bit the unfused pair,
    and within the bound on a random subset of features."""
    from kernels_numba.gemm_tc import tile_for
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_bits = _model_weight(2 * intermediate, k)
    tile = tile_for(m, 2 * intermediate)
    got = _swiglu_fused(x, w_bits, tile)
    np.testing.assert_array_equal(got, _swiglu_unfused(x, w_bits, tile))
    columns = np.sort(rng.choice(intermediate, size=min(intermediate, 512), replace=False))
    _assert_swiglu_within_bound(got, x, w_bits, columns)


def test_gemm_tc_with_block_k_64_and_three_stages(rng):
    """block_k 64 (4 k steps a slice) over a 3-stage ring that wraps (K 200: 3 whole slices and 8 of a fourth),
    M and N ending in partial tiles: the x and W regions carved from the one dynamic shared array."""
    tile = TileShape(32, 32, 64, 1, 2, 3)
    x, w_bits = _inputs(rng, 37, 45, 200)
    out = poisoned((37, 45), np.float32)
    got = gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), out, tile=tile)
    _assert_within_bound(got.copy_to_host(), x, w_bits)


def test_tiles_past_48_kb_pass_the_check():
    """Shared memory is dynamic, sized at launch: a tile may use up to the 227 KB a block may opt in to (H100, H200),
    no longer only the 48 KB of a static declaration."""
    from kernels_numba.gemm_tc import SHARED_LIMIT
    big = TileShape(128, 128, 64, 2, 2, 3)
    assert big.shared_bytes() == 3 * 256 * 72 * 2 > 48 * 1024
    big.check()
    widest = TileShape(128, 256, 64, 2, 4, 4)  # 4 x 384 x 72 x 2 = 221184 B: just under the limit
    assert widest.shared_bytes() <= SHARED_LIMIT == 232448
    widest.check()


def test_to_bf16_rows_rounds_a_strided_view_to_nearest_even(rng):
    x = rng.standard_normal((5, 24)).astype(np.float32)
    x[0, :4] = [np.inf, -0.0, np.nan, 3.0000002]
    out = poisoned((5, 12), np.uint16)
    to_bf16_rows(cuda.to_device(x)[:, 6:18], out)
    got = out.copy_to_host()
    want = x[:, 6:18].astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got, want)


def test_gemm_tc_rejects_what_it_cannot_run(rng):
    x, w_bits = _inputs(rng, 4, 16, 60)
    with pytest.raises(AssertionError, match="multiple"):
        gemm_tc(cuda.to_device(x), cuda.to_device(w_bits))  # K = 60: not whole 16-byte copies
    x, w_bits = _inputs(rng, 4, 16, 64)
    with pytest.raises(AssertionError, match="SwiGLUEpilogue"):
        gemm_tc_fused(cuda.to_device(x), cuda.to_device(w_bits), SwiGLUEpilogue())  # float32 out: the GEMV's
    with pytest.raises(AssertionError, match="needs the whole sum"):
        gemm_tc_fused(cuda.to_device(x), cuda.to_device(w_bits), SwiGLUEpilogue(bf16=True), tile=SMALL, splits=2)
    with pytest.raises(AssertionError, match="294912 B of shared memory a block, over the 232448 B"):
        gemm_tc_kernel(TileShape(256, 256, 64, 4, 4, 4))  # 4 stages of 512 rows of 72 bf16: past 227 KB
    with pytest.raises(AssertionError, match="multiple of 16"):
        gemm_tc_kernel(TileShape(48, 32, 32, 2, 2))
    empty = gemm_tc(cuda.to_device(np.zeros((0, 64), np.float32)), cuda.to_device(w_bits))
    assert empty.shape == (0, 16)


# The projections of Llama-3.2-1B (hidden 2048: q|k|v 3072, o 2048, gate|up 16384, down K 8192, LM head 128256, and
# the separate q / kv widths 2048 / 512), SmolLM2-135M (576: q|k|v 960, gate|up 3072, down K 1536, LM head 49152)
# and the demo model (64: q|k|v 128, gate|up 256, down K 128, LM head 640), at a decode batch and prefill sizes;
# wide outputs are checked on a random subset of columns (numpy's float64 reference is the slow part).
MODEL_SHAPES = [(3072, 2048), (2048, 2048), (512, 2048), (16384, 2048), (2048, 8192), (128256, 2048),
                (960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576),
                (128, 64), (64, 64), (256, 64), (64, 128), (640, 64)]


@functools.cache
def _model_weight(n, k):
    """Random bf16 bit patterns of +-[2^-7, 2), drawn once per shape as integers (the LM head's 263M weights
    as normal floats took ten seconds a test)."""
    bits = np.random.default_rng(n * 10007 + k).integers(0, 2048, (n, k), dtype=np.uint16)
    return (np.uint16(0x3C00) + (bits & np.uint16(0x3FF))) | ((bits >> np.uint16(10)) << np.uint16(15))


@pytest.mark.skipif(SIMULATOR, reason="GPU only (TINYVLLM_TEST_GPU=1): full-size shapes")
@pytest.mark.parametrize("n, k", MODEL_SHAPES)
@pytest.mark.parametrize("m", [1, 77, 300])
def test_gemm_tc_model_shapes_on_the_gpu(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_bits = _model_weight(n, k)
    out = poisoned((m, n), np.float32)
    got = gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), out, tile=DEFAULT_TILE).copy_to_host()
    assert not np.isnan(got).any(), "some outputs were never written"
    columns = np.sort(rng.choice(n, size=min(n, 512), replace=False))
    _assert_within_bound(got, x, w_bits, columns)


@pytest.mark.skipif(SIMULATOR, reason="GPU only (TINYVLLM_TEST_GPU=1): full-size shapes")
@pytest.mark.parametrize("n, k", [(2048, 8192), (2048, 2048), (3072, 2048), (576, 1536)])
@pytest.mark.parametrize("m", [64, 77, 256])
def test_split_k_at_decode_batches_on_the_gpu(rng, m, n, k):
    """The plan's tile at split_for's splits and at 3 (uneven: 21, 21 and 22 slices of K 2048), with a
    residual: within the bound, residual_out one float32 add more."""
    from kernels_numba.gemm_tc import split_for, tile_for
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_bits = _model_weight(n, k)
    residual = rng.standard_normal((m, n)).astype(np.float32)
    tile = tile_for(m, n)
    columns = np.sort(rng.choice(n, size=min(n, 512), replace=False))
    for splits in sorted({split_for(m, n, k, tile), 3}):
        out, summed = poisoned((m, n), np.float32), poisoned((m, n), np.float32)
        gemm_tc_fused(cuda.to_device(x), cuda.to_device(w_bits), ResidualEpilogue(cuda.to_device(residual), summed),
                      out=out, tile=tile, splits=splits)
        got = out.copy_to_host()
        assert not np.isnan(got).any(), f"splits {splits}: some outputs were never written"
        _assert_within_bound(got, x, w_bits, columns)
        np.testing.assert_array_equal(summed.copy_to_host(), got + residual)


@pytest.mark.skipif(SIMULATOR, reason="GPU only (TINYVLLM_TEST_GPU=1): tiles past 48 KB of shared memory")
@pytest.mark.parametrize("tile, splits", [(TileShape(128, 128, 64, 2, 2, 3), 1), (TileShape(128, 256, 32, 2, 4, 3), 1),
                                          (TileShape(128, 128, 64, 2, 2, 4), 2)])
def test_tiles_past_48_kb_on_the_gpu(rng, tile, splits):
    """Tiles of 108, 90 and 144 KB of dynamic shared memory (the launch opts each kernel in first) at q|k|v's
    shape with 300 tokens (partial tiles in M): every output written, within the bound; the 144 KB tile through
    split-K's kernel (another kernel to opt in) with a residual."""
    assert tile.shared_bytes() > 48 * 1024
    n, k = 3072, 2048
    x = rng.standard_normal((300, k)).astype(np.float32)
    w_bits = _model_weight(n, k)
    residual = rng.standard_normal((300, n)).astype(np.float32)
    columns = np.sort(rng.choice(n, size=512, replace=False))
    for _ in range(2):  # the second launch finds the kernel opted in already
        out, summed = poisoned((300, n), np.float32), poisoned((300, n), np.float32)
        gemm_tc_fused(cuda.to_device(x), cuda.to_device(w_bits), ResidualEpilogue(cuda.to_device(residual), summed),
                      out=out, tile=tile, splits=splits)
        got = out.copy_to_host()
        assert not np.isnan(got).any(), "some outputs were never written"
        _assert_within_bound(got, x, w_bits, columns)
        np.testing.assert_array_equal(summed.copy_to_host(), got + residual)


@pytest.mark.skipif(SIMULATOR, reason="GPU only (TINYVLLM_TEST_GPU=1): the GPU's own shared memory limit")
def test_launch_with_shared_past_the_gpus_limit_says_so():
    from kernels_numba.common import launch_with_shared

    @cuda.jit
    def fill(out):
        smem = cuda.shared.array(0, np.float32)
        smem[cuda.threadIdx.x] = cuda.threadIdx.x
        out[cuda.threadIdx.x] = smem[cuda.threadIdx.x]

    limit = cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    out = poisoned(32, np.float32)
    launch_with_shared(fill, 1, 32, limit, out)  # the most it may have: fine
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(32, dtype=np.float32))
    with pytest.raises(AssertionError, match=f"{limit + 16} B of shared memory a block, over the {limit} B"):
        launch_with_shared(fill, 1, 32, limit + 16, out)


def test_launch_with_shared_opts_each_loaded_kernel_in_once(monkeypatch):
    """The GPU path of common.launch_with_shared, its driver call stood in for (runs in the simulator too): past 48
    KB the overload the arguments select is allowed the bytes before its launch, once per loaded function (again
    only for more); at 48 KB or less nothing is set; past the GPU's opt-in limit, a message and no launch."""
    from types import SimpleNamespace

    import kernels_numba.common as common
    events = []
    device = SimpleNamespace(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=232448, name="H200", id=0)

    class Function:  # a loaded kernel: hashed by identity, as numba's CudaPythonFunction
        def __init__(self, name):
            self.device, self.name = device, name

    functions = {t: Function(t) for t in ("u2", "f4")}

    class FakeKernel:  # a numba dispatcher: types arguments, compiles (or finds) an overload, launches
        def __init__(self):
            self.__qualname__ = "fake_kernel"  # (update_wrapper gives a dispatcher its function's)

        def typeof_pyval(self, a):
            return a.dtype.str[1:]

        def compile(self, argtypes):
            events.append(("compile", argtypes))
            return SimpleNamespace(_codelibrary=SimpleNamespace(get_cufunc=lambda: functions[argtypes[0]]))

        def __getitem__(self, config):
            return lambda *args: events.append(("launch", config[3], args[0].dtype.str[1:]))

    monkeypatch.setattr(common, "SIMULATOR", False)
    monkeypatch.setattr(common, "_SHARED_OPT_INS", {})
    monkeypatch.setattr(common, "_set_max_dynamic_shared", lambda f, n: events.append(("allow", f.name, n)))
    kernel, u2, f4 = FakeKernel(), np.zeros(1, np.uint16), np.zeros(1, np.float32)
    common.launch_with_shared(kernel, 1, 32, 48 * 1024, u2)
    assert events == [("launch", 48 * 1024, "u2")]
    events.clear()
    for shared, arg in [(110592, u2), (110592, u2), (110592, f4), (65536, f4), (147456, f4)]:
        common.launch_with_shared(kernel, 1, 32, shared, arg)
    assert [e for e in events if e[0] != "compile"] == [
        ("allow", "u2", 110592), ("launch", 110592, "u2"), ("launch", 110592, "u2"),
        ("allow", "f4", 110592), ("launch", 110592, "f4"), ("launch", 65536, "f4"),
        ("allow", "f4", 147456), ("launch", 147456, "f4")]
    events.clear()
    with pytest.raises(AssertionError, match="fake_kernel: 232464 B of shared memory a block, over the 232448 B"):
        common.launch_with_shared(kernel, 1, 32, 232464, u2)
    assert events == [("compile", ("u2",))]


def test_tile_for_picks_the_sweeps_winners():
    """Every case of the H200 sweeps (docs/bench/h200-round7-sweep_tc_gemm.log; Round 10's tiles past 48 KB:
    h200-round10-sweep-tc-gemm-dynamic.log at 1,024 / 4,096 rows, h200-round10-sweep-tc-gemm-decode-sizes.log at 128
    / 256): (tokens, N of the projection) -> the tile that won it (at 1,024 rows qkv within 1 %, the 128 x 128
    x 64 over 2 x 4 warps best for down by 1 %). qkv 3072, o_proj 2048, gate_up 16384, down 2048 output features."""
    from kernels_numba.gemm_tc import LARGE_TILE, SMALL_TILE, tile_for
    winners = {(128, 3072): SMALL_TILE, (128, 2048): SMALL_TILE, (128, 16384): LARGE_TILE,
               (256, 3072): SMALL_TILE, (256, 2048): SMALL_TILE, (256, 16384): LARGE_TILE,
               (1024, 3072): LARGE_TILE, (1024, 2048): LARGE_TILE, (1024, 16384): LARGE_TILE,
               (4096, 3072): LARGE_TILE, (4096, 2048): LARGE_TILE, (4096, 16384): LARGE_TILE,
               (512, 3072): DEFAULT_TILE}  # LARGE's 96 blocks are under LARGE_MIN_WAVE, DEFAULT's 192 a wave
    for (m, n), tile in winners.items():
        assert tile_for(m, n) == tile, (m, n)
    for tile in (DEFAULT_TILE, LARGE_TILE, SMALL_TILE):
        tile.check()


# ---- split-K ----
SPLIT_TILE = TileShape(16, 32, 16, 1, 1)  # one warp, block_k 16: a short K still has several slices to split


def _split_bounds(k, splits, block_k):
    """Split z's K range [begin, end), as the kernel cuts it: slices z S // splits .. (z + 1) S // splits."""
    slices = -(-k // block_k)
    return [(z * slices // splits * block_k, min(k, (z + 1) * slices // splits * block_k)) for z in range(splits)]


# M 20 and N 40 end in partial tiles; K 112 is 7 slices of 16: 3 splits of 2, 2 and 3 slices, 2 of 3 and 4.
@pytest.mark.parametrize("splits, k, residual", [(2, 128, False), (3, 112, False), (2, 112, True), (3, 112, True)])
def test_split_k_matches_ref_within_the_bound(rng, splits, k, residual):
    x, w_bits = _inputs(rng, 20, 40, k)
    out = poisoned((20, 40), np.float32)
    if residual:
        res = rng.standard_normal((20, 40)).astype(np.float32)
        summed = poisoned((20, 40), np.float32)
        result = gemm_tc_fused(cuda.to_device(x), cuda.to_device(w_bits), ResidualEpilogue(cuda.to_device(res), summed),
                               out=out, tile=SPLIT_TILE, splits=splits)
        assert result.out is out and result.residual_out is summed
    else:
        assert gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), out, tile=SPLIT_TILE, splits=splits) is out
    got = out.copy_to_host()
    _assert_within_bound(got, x, w_bits)  # splits - 1 more float32 adds: still within K 2^-23 sum |x w|
    if residual:
        np.testing.assert_array_equal(summed.copy_to_host(), got + res)  # one float32 add, as without split-K


def test_split_k_is_the_in_order_sum_of_each_splits_gemm(rng, monkeypatch):
    """Bit for bit: split z's partial is gemm_tc (one pass) over its K range; the reduce adds them in split order
    (((p0 + p1) + p2), float32). Two runs agree bit for bit (no atomics), the second on the workspace a
    BufferArena recorded in the first (as a captured CUDA graph replays it)."""
    import kernels_numba.gemm_tc as gemm_tc_module
    from kernels_numba.common import BufferArena, launching_into
    k, splits = 112, 3
    x, w_bits = _inputs(rng, 20, 40, k)
    x_bits = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    arena, runs = BufferArena(), []
    for _ in range(2):
        out = poisoned((20, 40), np.float32)
        with launching_into(0, arena):
            runs.append(gemm_tc(cuda.to_device(x_bits), cuda.to_device(w_bits), out, tile=SPLIT_TILE,
                                splits=splits).copy_to_host())
        arena.rewind()
    assert [(b.shape, b.dtype) for b in arena.buffers] == [((splits * 20, 40), np.float32)]  # the workspace
    np.testing.assert_array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))

    def no_split_k(*args, **kwargs):
        raise AssertionError("splits=1 allocated a workspace or launched the reduce")
    monkeypatch.setattr(gemm_tc_module, "device_empty", no_split_k)  # splits=1: today's one launch, nothing else
    monkeypatch.setattr(gemm_tc_module, "sum_splits_kernel", no_split_k)
    want = None
    for begin, end in _split_bounds(k, splits, SPLIT_TILE.block_k):
        part = poisoned((20, 40), np.float32)
        gemm_tc(cuda.to_device(np.ascontiguousarray(x_bits[:, begin:end])),
                cuda.to_device(np.ascontiguousarray(w_bits[:, begin:end])), part, tile=SPLIT_TILE, splits=1)
        want = part.copy_to_host() if want is None else want + part.copy_to_host()
    np.testing.assert_array_equal(runs[0].view(np.uint32), want.view(np.uint32))


def test_sum_splits_adds_in_split_order(rng):
    """The reduce alone, bit for bit against numpy's float32 sum in split order; the last column is a case where
    the order shows: (1 + 2^-24) + 2^-24 = 1 in float32, 1 + (2^-24 + 2^-24) = 1 + 2^-23."""
    from kernels_numba.common import grid_stride_launch
    from kernels_numba.gemm_tc import sum_splits_kernel
    splits, m, n = 3, 5, 7
    partials = (rng.standard_normal((splits, m, n)) * 10.0 ** rng.integers(-4, 4, (splits, m, n))).astype(np.float32)
    partials[:, :, -1] = np.array([1.0, 2.0**-24, 2.0**-24], np.float32)[:, None]
    res = rng.standard_normal((m, n)).astype(np.float32)
    out, summed = poisoned((m, n), np.float32), poisoned((m, n), np.float32)
    blocks, threads = grid_stride_launch(m * n)
    sum_splits_kernel(True)[blocks, threads](cuda.to_device(partials.reshape(splits * m, n)), splits, out,
                                             cuda.to_device(res), summed)
    want = (partials[0] + partials[1]) + partials[2]
    assert (want[:, -1] == 1.0).all()
    np.testing.assert_array_equal(out.copy_to_host(), want)
    np.testing.assert_array_equal(summed.copy_to_host(), want + res)


def test_gemm_tc_kernel_is_one_kernel_per_variant_however_asked():
    """scripts/check_tc_sass.py reads the SASS of the kernel gemm_tc_fused launched: the same object."""
    assert gemm_tc_kernel(SMALL) is gemm_tc_kernel(SMALL, False, False) is gemm_tc_kernel(SMALL, residual=False)
    assert gemm_tc_kernel(SMALL, split=True) is gemm_tc_kernel(SMALL, False, True)
    assert gemm_tc_kernel(SMALL, split=True) is not gemm_tc_kernel(SMALL)
    assert gemm_tc_kernel(SMALL, swiglu=True) is gemm_tc_kernel(SMALL, False, False, True)
    assert gemm_tc_kernel(SMALL, swiglu=True) is not gemm_tc_kernel(SMALL)
    with pytest.raises(AssertionError, match="needs the whole sum"):
        gemm_tc_kernel(SMALL, split=True, swiglu=True)


def test_gemm_tc_rejects_splits_it_cannot_run(rng):
    x, w_bits = _inputs(rng, 4, 16, 64)  # 2 slices of 32
    for splits in (0, 3):
        with pytest.raises(AssertionError, match="splits"):
            gemm_tc(cuda.to_device(x), cuda.to_device(w_bits), tile=SMALL, splits=splits)


def test_split_for_splits_decode_batches_and_never_prefill():
    from kernels_numba.gemm_tc import H200_SMS, MIN_SPLIT_SLICES, SMALL_TILE, SPLIT_BLOCKS_PER_SM, split_for, tile_for
    # Llama-3.2-1B at decode batches 64 and 256 (docs/bench/h200-round8-sweep-tc-gemm-decode.log): down_proj's 32 or
    # 128 blocks of 64 x 64 walk 256 slices, o_proj's 64; gate_up's 128 x 128 blocks at 256 rows fill the GPU already.
    cases = {(64, 2048, 8192): 8, (256, 2048, 8192): 2, (64, 2048, 2048): 4, (256, 2048, 2048): 2,
             (64, 3072, 2048): 4, (256, 3072, 2048): 1, (256, 16384, 2048): 1, (64, 16384, 2048): 1}
    for (m, n, k), splits in cases.items():
        tile = tile_for(m, n)
        assert split_for(m, n, k, tile) == splits, (m, n, k, tile)
    for m, n, k in [(40, 64, 64), (300, 128, 128)]:  # the demo model: too few slices to split
        assert split_for(m, n, k, tile_for(m, n)) == 1
    for m in range(33, 4097, 7):  # the rule's invariants, over every row count past the GEMV crossover
        for n, k in MODEL_SHAPES:
            tile = tile_for(m, n)
            splits = split_for(m, n, k, tile)
            blocks = -(-m // tile.block_m) * -(-n // tile.block_n)
            assert splits == 1 or -(-k // tile.block_k) >= splits * MIN_SPLIT_SLICES, (m, n, k)
            assert splits == 1 or blocks * splits // 2 < H200_SMS * SPLIT_BLOCKS_PER_SM, (m, n, k)  # the fewest
    # Prefill: thousands of rows stay on today's one-pass kernel, for every projection shape of MODEL_SHAPES.
    for m in (2048, 4096, 8192):
        for n, k in MODEL_SHAPES:
            assert split_for(m, n, k, tile_for(m, n)) == 1, (m, n, k)
    assert split_for(64, 2048, 8192, SMALL_TILE, sm_count=16) == 1
    from kernels_numba.gemm_tc import LARGE_TILE
    assert split_for(128, 16384, 2048, LARGE_TILE) == 1  # 128 blocks, under a wave: LARGE_TILE stays one pass


def test_the_fast_plan_splits_decode_batches_on_a_gpu(monkeypatch):
    """KernelPlan.project hands gemm_tc split_for's splits on a GPU (simulator=False) without batch invariance, 1 in the
    simulator."""
    from types import SimpleNamespace

    import tinyvllm.runner.kernel_plan as kernel_plan
    from kernels_numba.gemm_tc import SMALL_TILE
    calls = []
    monkeypatch.setattr(kernel_plan, "gemm_tc", lambda x, w, tile, splits: calls.append((tile, splits)))
    simulated = kernel_plan.KernelPlan("fast", head_dim=64, group=4, simulator=True)
    plan = kernel_plan.KernelPlan("fast", head_dim=64, group=4, simulator=False, batch_invariant=False)
    x, w_down = SimpleNamespace(shape=(256, 8192)), SimpleNamespace(shape=(2048, 8192))  # down_proj, batch 256
    simulated.project(x, w_down)  # first as in the simulator (also on a GPU)
    plan.project(x, w_down)
    plan.project(SimpleNamespace(shape=(4096, 8192)), w_down)  # prefill
    assert calls == [(kernel_plan.SIMULATOR_TILE, 1), (SMALL_TILE, 2), (plan.tc_tile(4096, 2048), 1)]


def test_the_fast_plan_fuses_the_gate_into_gate_up_where_it_runs_in_one_pass(monkeypatch):
    """KernelPlan.gate on a GPU (simulator=False): gemm_tc with SwiGLUEpilogue(bf16=True) where gate|up takes gemm_tc
    without split-K (prefill; Llama-3.2-1B's gate|up at decode batches too: LARGE_TILE, one pass), else gemm_tc's
    float32 gate|up then silu_mul_gate_up(bf16=True); the fp32 plan never fuses. The stage record's name says which."""
    from types import SimpleNamespace

    import tinyvllm.runner.kernel_plan as kernel_plan
    calls = []
    monkeypatch.setattr(kernel_plan, "gemm_tc_fused", lambda x, w, epilogue, tile: calls.append(
        ("fused", epilogue, tile)) or SimpleNamespace(out="gated"))
    monkeypatch.setattr(kernel_plan, "gemm_tc", lambda x, w, tile, splits: calls.append(("gemm_tc", splits)) or gate_up)
    monkeypatch.setattr(kernel_plan, "silu_mul_gate_up", lambda gate_up, bf16: calls.append((gate_up, bf16)))
    plan = kernel_plan.KernelPlan("fast", head_dim=64, group=4, simulator=False, batch_invariant=False)
    fp32 = kernel_plan.KernelPlan("fp32", 64, 4, simulator=False, batch_invariant=False)
    gate_up = SimpleNamespace(shape=(64, 2048))
    for rows in (4096, 64):  # Llama-3.2-1B: hidden 2048, intermediate 8192
        assert plan.fuses_swiglu(rows, 2048, 8192) and not fp32.fuses_swiglu(rows, 2048, 8192)
        gate = plan.gate(rows, 2048, 8192)
        assert gate(SimpleNamespace(shape=(rows, 2048)), SimpleNamespace(shape=(16384, 2048))) == "gated"
        assert calls.pop() == ("fused", SwiGLUEpilogue(bf16=True), plan.tc_tile(rows, 16384))
        assert gate.name == "gemm_tc.gemm_tc (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)"
    # a narrow gate|up over a long K at a decode batch: SMALL_TILE's 32 blocks split K, so the pair runs
    assert not plan.fuses_swiglu(64, 8192, 1024)
    gate = plan.gate(64, 8192, 1024)
    gate(SimpleNamespace(shape=(64, 8192)), SimpleNamespace(shape=(2048, 8192)))
    assert calls[0][0] == "gemm_tc" and calls[0][1] > 1 and calls[1] == (gate_up, True)
    assert gate.name == "gemm_tc.gemm_tc (gate|up in one) + activation.silu_mul_gate_up (bf16)"
    assert not plan.fuses_swiglu(2, 2048, 8192)  # under the GEMV crossover: the fused-GEMV layer's own gate
