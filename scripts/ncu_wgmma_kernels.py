"""The wgmma kernels under Nsight Compute: prefill_wgmma (one 4,096-token prompt, the 1B's 32 / 8 heads of 64) and
gemm_wgmma (4,096 rows: q|k|v, o_proj, gate|up with the SwiGLU epilogue, down_proj; tile_for's tiles), each launched
once eagerly between cuda.profile_start() and profile_stop() after a warm-up launch. Random inputs. GPU (Hopper) only.

    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy \
        --section LaunchStats python scripts/ncu_wgmma_kernels.py
"""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels_numba.common import cuda
from kernels_numba.kv_dtype import kv_encode_ref, kv_storage_dtype
from kernels_numba.attention.prefill_wgmma import build_prefill_wgmma_tiles, paged_attention_prefill_wgmma
from kernels_numba.gemm_wgmma import gemm_wgmma, gemm_wgmma_fused, tile_for
from kernels_numba.epilogues import SwiGLUEpilogue
rng = np.random.default_rng(0)
T, H, KVH, D, B = 4096, 32, 8, 64, 16
blocks = T // B
pd = kv_storage_dtype("bfloat16")
k = cuda.to_device(kv_encode_ref(rng.standard_normal((blocks, B, KVH, D), np.float32), pd))
v = cuda.to_device(kv_encode_ref(rng.standard_normal((blocks, B, KVH, D), np.float32), pd))
tables = cuda.to_device(rng.permutation(blocks).astype(np.int32).reshape(1, blocks))
q = cuda.to_device(rng.standard_normal((T, H, D), np.float32))
seq = cuda.to_device(np.zeros(T, np.int32)); pos = cuda.to_device(np.arange(T, dtype=np.int32))
tiles = build_prefill_wgmma_tiles(seq, pos, H // KVH)
out = cuda.device_array((T, H, D), np.float32)
def bits(shape):
    return cuda.to_device((rng.standard_normal(shape, np.float32).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
shapes = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}
xs = {n: bits((T, kk)) for n, (nn, kk) in shapes.items()}
ws = {n: bits((nn, kk)) for n, (nn, kk) in shapes.items()}
def launch_all():
    paged_attention_prefill_wgmma(q, k, v, tables, seq, pos, 0.125, out=out, tiles=tiles)
    for n in shapes:
        tile = tile_for(T, shapes[n][0])
        if n == "gate_up":
            gemm_wgmma_fused(xs[n], ws[n], SwiGLUEpilogue(bf16=True), tile=tile)
        else:
            gemm_wgmma(xs[n], ws[n], tile=tile)
launch_all(); cuda.synchronize()
cuda.profile_start(); launch_all(); cuda.synchronize(); cuda.profile_stop()
print("done")
