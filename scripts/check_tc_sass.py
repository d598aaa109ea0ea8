"""On the GPU: compile gemm_tc for every tile shape scripts/sweep_tc_gemm.py sweeps (and the residual epilogue at
the default tile, split-K at the default and small tiles) and the tensor-core prefill attention, then read each
kernel's SASS (nvdisasm): tensor-core mmas (HMMA), ldmatrix (LDSM) and, in gemm_tc and prefill_tc from a bf16 pool,
cp.async (LDGSTS) must be there, local memory (LDL / STL: spills or a register array indexed at run time) must not:
not in any tile gemm_tc.tile_for picks; in the sweep's other candidates it is reported ("spills"), for the sweep to
weigh (local ptxas: 128 x 128 x 64 over 2 x 2 warps spills 64 bytes).

    python scripts/check_tc_sass.py            # prints one line per kernel, then PASS or FAIL (exit status 1)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def count(sass: str, opcode: str) -> int:
    return sum(1 for line in sass.splitlines() if f" {opcode}" in line or f"\t{opcode}" in line)


def main() -> int:
    from kernels_numba.common import cuda
    from kernels_numba.epilogues import ResidualEpilogue
    from kernels_numba.gemm_tc import DEFAULT_TILE, LARGE_TILE, SMALL_TILE, TileShape, gemm_tc_fused, gemm_tc_kernel
    from sweep_tc_gemm import TILES
    x = cuda.to_device(np.zeros((8, 128), np.uint16))
    w = cuda.to_device(np.zeros((16, 128), np.uint16))
    residual = cuda.to_device(np.zeros((8, 16), np.float32))
    cases = ([(DEFAULT_TILE, True, 1)] + [(TileShape(*spec), False, 1) for spec in TILES]
             + [(DEFAULT_TILE, False, 2), (SMALL_TILE, False, 2)])  # split-K: K 128 is 2 slices of 64 or 4 of 32
    failures = 0
    for tile, with_residual, splits in cases:
        try:
            kernel = gemm_tc_kernel(tile, with_residual, splits > 1)
        except AssertionError as e:
            print(f"skip {tile}: {e}")
            continue
        gemm_tc_fused(x, w, ResidualEpilogue(residual) if with_residual else None, tile=tile,
                      splits=splits)  # compiles it
        cuda.synchronize()
        if not kernel.overloads:  # the launcher compiled another kernel object than the one read here
            failures += 1
            print(f"FAIL {tile}: the kernel read here was never compiled", flush=True)
        for signature, sass in kernel.inspect_sass().items():
            regs = kernel.overloads[signature].regs_per_thread
            hmma, ldsm, ldgsts = count(sass, "HMMA"), count(sass, "LDSM"), count(sass, "LDGSTS")
            local = count(sass, "LDL") + count(sass, "STL")
            planned = tile in (DEFAULT_TILE, LARGE_TILE, SMALL_TILE)  # what tile_for picks: no local memory
            ok = hmma > 0 and ldsm > 0 and ldgsts > 0 and (local == 0 or not planned)
            failures += not ok
            verdict = ("ok  " if local == 0 else "spills") if ok else "FAIL"
            print(f"{verdict} {tile}{' +residual' if with_residual else ''}"
                  f"{' split-K' if splits > 1 else ''}: HMMA {hmma}, LDSM {ldsm}, "
                  f"LDGSTS {ldgsts}, LDL/STL {local}, registers {regs}", flush=True)
    # prefill_tc at Llama-3.2-1B's shape (head_dim 64, 4 heads a KV head, blocks of 16), either pool: HMMA and LDSM
    # (and LDGSTS from a bf16 pool), no local memory; the same with TcOptions.max_registers 128 for information (two
    # 8-warp blocks an SM if it does not spill). The kernel is looked up with the launcher's exact arguments (a
    # functools.cache key), and a kernel with no SASS fails.
    import dataclasses
    from kernels_numba.attention.prefill_tc import (TC_KEY_TILE, TC_OPTIONS, TC_WARPS, paged_attention_prefill_tc,
                                                    paged_attention_prefill_tc_kernel)
    for pool_dtype, options, counts in ((np.float32, TC_OPTIONS, True), (np.uint16, TC_OPTIONS, True),
                                        (np.uint16, dataclasses.replace(TC_OPTIONS, max_registers=128), False)):
        pool = cuda.to_device(np.zeros((2, 16, 1, 64), pool_dtype))
        one = cuda.to_device(np.zeros(1, np.int32))
        paged_attention_prefill_tc(cuda.to_device(np.zeros((1, 4, 64), np.float32)), pool, pool,
                                   cuda.to_device(np.zeros((1, 2), np.int32)), one, one, 0.125, options=options)
        cuda.synchronize()
        bf16_pool = pool_dtype == np.uint16
        kernel = paged_attention_prefill_tc_kernel(64, 4, 16, TC_WARPS, TC_KEY_TILE, bf16_pool, options)
        sasses = kernel.inspect_sass()
        failures += counts and not sasses
        for signature, sass in sasses.items():
            hmma, ldsm, ldgsts = count(sass, "HMMA"), count(sass, "LDSM"), count(sass, "LDGSTS")
            local = count(sass, "LDL") + count(sass, "STL")
            ok = hmma > 0 and ldsm > 0 and local == 0 and (ldgsts > 0 or not bf16_pool)
            failures += counts and not ok
            print(f"{('ok  ' if ok else 'FAIL') if counts else 'info'} prefill_tc (head_dim 64, group 4, "
                  f"{'bf16' if bf16_pool else 'float32'} pool, max_registers {options.max_registers}): HMMA {hmma}, "
                  f"LDSM {ldsm}, LDGSTS {ldgsts}, LDL/STL {local}, "
                  f"registers {kernel.overloads[signature].regs_per_thread}", flush=True)
    print("sass check:", "PASS" if failures == 0 else f"FAIL ({failures} kernels)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
