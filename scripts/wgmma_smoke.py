"""wgmma from numba on an H100/H200, in one command: compile, correctness, speed; every check in a child process of
its own (a kernel that faults poisons its CUDA context, one that hangs is killed), each failure printed with its
message, the next check run regardless, a summary last (exit status 1 if any check failed).

    python scripts/wgmma_smoke.py                  # on the GPU: both routes (wgmma.py's docstring), then timing
    python scripts/wgmma_smoke.py --routes numba   # one route
    python scripts/wgmma_smoke.py --offline        # no GPU: both routes' PTX, ptxas, numba's link and SASS

Checks, per route ("numba": numba-cuda's own sm_90a target; "ptx": the PTX rewritten for sm_90a inside numba's
compile; both in kernels_numba/wgmma.py's docstring and docs/wgmma.md):
- compile:ROUTE, the GEMM kernel compiled as it launches: the PTX's .target line, its wgmma instructions, and from
  the SASS (nvdisasm, if numba finds it) HGMMA, cp.async (LDGSTS), local memory (LDL/STL), registers a thread.
- single:ROUTE, one warpgroup, D = C + 2 A B.T with two wgmma m64n64k16 (A, B stored by plain stores): the
  documented layout (LBO = the next 8 K, SBO = the next 8 rows); if that fails, the same with LBO and SBO swapped,
  to tell a descriptor mix-up from a fragment-layout one.
- gemm:ROUTE, gemm_wgmma against numpy at 3 shapes (64 x 64 x 32, 300 x 200 x 136 with partial tiles, and
  4,096 x 2,048 x 2,048): max |err|, and PASS when within gemm_tc's bound K 2^-23 sum |x w|.
- time (first route that passed gemm): the 1B model's prefill GEMMs (q|k|v, o_proj, gate|up, down_proj at 4,096
  and 1,024 tokens): gemm_wgmma at a few tiles, gemm_tc (mma.sync) and torch.matmul in bf16 when torch imports
  (cuBLAS), as TFLOP/s (median of 7 batches of 10 back-to-back launches), and whether gemm_wgmma's bits equal
  gemm_tc's.
- pytest, last: `TINYVLLM_TEST_GPU=1 pytest tests/test_wgmma.py` (wgmma at n 8-256, the GEMM at 5 shapes and tiles,
  the ptx route once). Checks stop being started once --budget-s (540 s) is spent.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

# (kernels_numba first: where there is no GPU it picks the simulator before numba is imported)
from kernels_numba.common import SHARED_ALIGN, cuda, jit  # noqa: E402
from kernels_numba.wgmma import (ROUTES, WARPGROUP, fence_proxy_async, matrix_descriptor, shared_address,  # noqa: E402
                                 wgmma_bf16, wgmma_commit, wgmma_fence, wgmma_wait_group)

SHAPES = [(64, 64, 32), (300, 200, 136), (4096, 2048, 2048)]
# the 1B model's prefill GEMMs (M tokens, N out, K in)
TIME_SHAPES = [(m, n, k, name) for m in (4096, 1024) for n, k, name in
               ((3072, 2048, "q|k|v"), (2048, 2048, "o_proj"), (16384, 2048, "gate|up"), (2048, 8192, "down_proj"))]
CHILD_TIMEOUT_S = 300


# ---- the checks (each runs in a child: `--check NAME`) ----

def _bits(rng, shape):
    import ml_dtypes
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint16)


def _launch_route(kernel, args, route):
    from kernels_numba.wgmma import compile_through_ptx_rewrite
    if route == "ptx":
        compile_through_ptx_rewrite(kernel, args)


def check_env(route):
    import numba
    import numba_cuda
    device = cuda.get_current_device()
    print(f"device {device.name.decode() if isinstance(device.name, bytes) else device.name}, "
          f"compute capability {device.compute_capability}")
    print(f"numba {numba.__version__}, numba-cuda {getattr(numba_cuda, '__version__', '?')}, "
          f"driver {cuda.cudadrv.driver.driver.get_version()}, runtime {cuda.runtime.get_version()}")
    try:
        from numba.cuda.cudadrv import nvvm
        print(f"NVVM {nvvm.NVVM().get_version()}, IR {nvvm.NVVM().get_ir_version()}")
    except Exception as e:  # noqa: BLE001 (informational)
        print(f"NVVM version unknown: {e}")
    try:
        import torch
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {torch.cuda.is_available()}")
    except Exception as e:  # noqa: BLE001
        print(f"torch not importable: {e}")
    return device.compute_capability >= (9, 0)


def _count(sass, opcode):
    return sum(1 for line in sass.splitlines() if re.search(rf"\b{opcode}\b", line))


def check_compile(route):
    from kernels_numba.gemm_wgmma import DEFAULT_TILE, gemm_wgmma_kernel
    from kernels_numba.wgmma import kernel_ptx, ptx_target
    kernel = gemm_wgmma_kernel(DEFAULT_TILE, route)
    from kernels_numba.common import flat_rows
    x, w = cuda.to_device(np.zeros((64, 64), np.uint16)), cuda.to_device(np.zeros((128, 64), np.uint16))
    args = (x, w, *flat_rows(x, w), cuda.device_array((64, 128), np.float32))
    started = time.perf_counter()
    _launch_route(kernel, args, route)
    ptx = kernel_ptx(kernel, args)
    print(f"route {route}: compiled in {time.perf_counter() - started:.1f} s; PTX {ptx_target(ptx)}, "
          f"{ptx.count('wgmma.mma_async')} wgmma.mma_async, {ptx.count('wgmma.fence')} wgmma.fence, "
          f"{ptx.count('fence.proxy.async')} fence.proxy.async")
    overload = kernel.overloads[tuple(kernel.typeof_pyval(a) for a in args)]
    print(f"registers a thread {overload.regs_per_thread}, local memory a thread {overload.local_mem_per_thread} B")
    ok = "wgmma.mma_async" in ptx and "sm_90a" in ptx_target(ptx)
    try:
        sass = overload.inspect_sass()
        counts = {op: _count(sass, op) for op in ("HGMMA", "LDGSTS", "LDL", "STL", "WARPGROUP")}
        print("SASS: " + ", ".join(f"{op} {n}" for op, n in counts.items()))
        ok = ok and counts["HGMMA"] > 0
    except Exception as e:  # noqa: BLE001 (nvdisasm missing: the PTX check stands)
        print(f"SASS not read ({type(e).__name__}: {e})")
    return ok


def probe_kernel(n, leading_a, leading_b, stride):
    """One warpgroup: D = C + 2 A B.T through two wgmma m64n{n}k16 (tests/test_wgmma.twice_kernel with the descriptor's
    byte offsets given)."""
    count = n // 2
    mma, wait = wgmma_bf16(n), wgmma_wait_group(0, count)

    @jit(cache=False)
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
        desc_a = matrix_descriptor(shared_address(a_tile, 0, 0, 0), leading_a, stride)
        desc_b = matrix_descriptor(shared_address(b_tile, 0, 0, 0), leading_b, stride)
        mma(acc, desc_a, desc_b)
        mma(acc, desc_a, desc_b)
        wgmma_commit()
        wait(acc)
        for j in range(count):
            d[row0 + 8 * ((j // 2) % 2), col0 + 8 * (j // 4) + j % 2] = acc[j]

    return kernel


def check_single(route):
    from kernels_numba.wgmma import wgmma_ref
    n = 64
    rng = np.random.default_rng(1)
    a, b = _bits(rng, (64, 16)), _bits(rng, (n, 16))
    c = rng.standard_normal((64, n)).astype(np.float32)
    want = wgmma_ref(a, b, wgmma_ref(a, b, c)).astype(np.float64)
    passed = False
    for name, (leading_a, leading_b, stride) in (("documented (LBO = next 8 K, SBO = next 8 rows)", (1024, 1024, 128)),
                                                  ("LBO and SBO swapped", (128, 128, 1024))):
        d = cuda.to_device(np.full((64, n), np.nan, np.float32))
        args = (cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
        kernel = probe_kernel(n, leading_a, leading_b, stride)
        _launch_route(kernel, args, route)
        kernel[1, 128](*args)
        cuda.synchronize()
        got = d.copy_to_host().astype(np.float64)
        err = np.abs(got - want)
        ok = bool(np.isfinite(got).all() and err.max() <= 1e-3 * np.abs(want).max())
        print(f"{name}: max |err| {np.nanmax(err):.3g} (|D| up to {np.abs(want).max():.3g}), "
              f"unwritten {int(np.isnan(got).sum())}: {'PASS' if ok else 'FAIL'}")
        if not ok:
            bad = np.argwhere(~(err <= 1e-3 * np.abs(want).max()))[:4]
            print("  first mismatches (row, col, got, want): "
                  + "; ".join(f"({r}, {col}, {got[r, col]:.4g}, {want[r, col]:.4g})" for r, col in bad))
        passed = passed or (ok and name.startswith("documented"))
        if ok:
            break
    return passed


def check_gemm(route, shapes=SHAPES):
    import ml_dtypes
    from kernels_numba.gemm_wgmma import DEFAULT_TILE, gemm_wgmma, gemm_wgmma_ref
    rng = np.random.default_rng(2)
    all_ok = True
    for m, n, k in shapes:
        try:
            x, w = _bits(rng, (m, k)), _bits(rng, (n, k))
            out = cuda.to_device(np.full((m, n), np.nan, np.float32))
            gemm_wgmma(cuda.to_device(x), cuda.to_device(w), out, tile=DEFAULT_TILE, route=route)
            cuda.synchronize()
            got = out.copy_to_host().astype(np.float64)
            x64, w64 = (v.view(ml_dtypes.bfloat16).astype(np.float64) for v in (x, w))
            ref = gemm_wgmma_ref(x, w).astype(np.float64)
            bound = k * 2.0**-23 * (np.abs(x64) @ np.abs(w64).T)
            err = np.abs(got - ref)
            ok = bool(np.isfinite(got).all() and (err <= bound + 1e-30).all())
            print(f"{m} x {n} x {k}: max |err| {np.nanmax(err):.3g}, worst err / bound {np.nanmax(err / bound):.3g}, "
                  f"unwritten {int(np.isnan(got).sum())}: {'PASS' if ok else 'FAIL'}")
        except Exception:  # noqa: BLE001 (the next shape still runs)
            print(f"{m} x {n} x {k}: FAIL\n{traceback.format_exc(limit=4)}")
            ok = False
        all_ok = all_ok and ok
    return all_ok


def _median_ms(launch, record, synchronize, batches=7, per_batch=10):
    """Milliseconds a launch, the median over `batches` of `per_batch` back-to-back launches between two events (a
    batch keeps the GPU's queue ahead of the host's per-launch cost). record() -> an event recorded now."""
    launch()
    synchronize()
    times = []
    for _ in range(batches):
        start = record()
        for _ in range(per_batch):
            launch()
        end = record()
        synchronize()
        times.append(start.elapsed_time(end) / per_batch)
    return sorted(times)[len(times) // 2]


def _numba_event():
    event = cuda.event()
    event.record()
    return event


def check_time(route):
    """The 1B model's prefill GEMMs (q|k|v, o_proj, gate|up, down_proj at 1,024 and 4,096 tokens): gemm_wgmma at a
    few tiles, gemm_tc at its own tile_for, torch.matmul bf16 (cuBLAS); TFLOP/s and the best wgmma / cuBLAS ratio.
    Also whether gemm_wgmma and gemm_tc give the same bits (what a plan switching between them would need)."""
    from kernels_numba.gemm_wgmma import WgmmaTile, gemm_wgmma
    from kernels_numba.gemm_tc import gemm_tc, tile_for
    try:
        import torch
    except ImportError as e:
        torch = None
        print(f"torch.matmul: not timed ({e})")
    rng = np.random.default_rng(3)
    tiles = [WgmmaTile(256, 2, 4), WgmmaTile(128, 2, 5), WgmmaTile(256, 2, 3), WgmmaTile(192, 2, 4),
             WgmmaTile(128, 1, 6)]
    print("median of 7 batches of 10 launches; TFLOP/s", flush=True)
    ratios = []
    for m, n, k, name in TIME_SHAPES:
        flops = 2 * m * n * k
        x, w = cuda.to_device(_bits(rng, (m, k))), cuda.to_device(_bits(rng, (n, k)))
        out = cuda.device_array((m, n), np.float32)
        results = {}

        def report(label, launch, record=_numba_event, synchronize=cuda.synchronize):
            try:
                ms = _median_ms(launch, record, synchronize)
                results[label] = flops / ms / 1e9
                print(f"  {name} {m} x {n} x {k}: {label}: {ms:.3f} ms, {results[label]:.0f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001 (the next one still runs)
                print(f"  {name}: {label}: FAIL {type(e).__name__}: {e}", flush=True)

        for tile in tiles:
            report(f"gemm_wgmma {tile}", lambda tile=tile: gemm_wgmma(x, w, out, tile=tile, route=route))
        tc_tile = tile_for(m, n)
        tc_out = cuda.device_array((m, n), np.float32)
        report(f"gemm_tc {tc_tile}", lambda: gemm_tc(x, w, tc_out, tile=tc_tile))
        gemm_wgmma(x, w, out, tile=tiles[0], route=route)
        differ = int((out.copy_to_host() != tc_out.copy_to_host()).sum())
        print(f"  {name}: gemm_wgmma vs gemm_tc: {differ} of {m * n} outputs differ in their bits", flush=True)
        if torch is not None:
            xt = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)

            def torch_event():
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                return event
            report("torch.matmul bf16 (cuBLAS)", lambda: torch.matmul(xt, wt.T), torch_event, torch.cuda.synchronize)
        best = max(((v, label) for label, v in results.items() if label.startswith("gemm_wgmma")), default=None)
        cublas = next((v for label, v in results.items() if label.startswith("torch")), None)
        if best and cublas:
            ratios.append(best[0] / cublas)
            print(f"  {name} {m}: best gemm_wgmma {best[0]:.0f} ({best[1]}) / cuBLAS {cublas:.0f} = "
                  f"{best[0] / cublas:.2f}", flush=True)
    if ratios:
        print(f"best gemm_wgmma / cuBLAS over the shapes: min {min(ratios):.2f}, max {max(ratios):.2f}")
    return True


CHECKS = {"env": check_env, "compile": check_compile, "single": check_single, "gemm": check_gemm, "time": check_time}


def run_child(name: str, route: str, timeout_s: float) -> bool:
    """One check in a fresh process; its output printed as it comes; True if it passed."""
    print(f"\n==== {name}:{route} ====", flush=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--check", name, "--route", route]
    return _run(command, timeout_s, f"{name}:{route}")


def _run(command, timeout_s: float, label: str, env=None) -> bool:
    try:
        done = subprocess.run(command, timeout=timeout_s, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        print(f"{label}: FAIL, no answer in {timeout_s:.0f} s (killed)", flush=True)
        return False
    return done.returncode == 0


def child(name: str, route: str) -> int:
    try:
        ok = CHECKS[name](route)
    except Exception:  # noqa: BLE001 (printed whole: the GPU run must say what broke)
        traceback.print_exc()
        ok = False
    print(f"{name}:{route}: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


# ---- without a GPU ----

def offline(routes) -> int:
    """Each route's compile as on an H200, without one: numba told the device is 9.0 (and, as 0.30 does there, to link
    for sm_90a), the kernel's PTX made, ptxas -v on it (registers, spills; on PATH or TINYVLLM_PTXAS), then numba's own
    link of it to a cubin (nvJitLink: a pip nvidia-nvjitlink's lib folder on LD_LIBRARY_PATH) and its SASS counted
    (nvdisasm on PATH or TINYVLLM_NVDISASM). Also needs an NVRTC library numba loads (pip nvidia-cuda-nvrtc)."""
    import contextlib
    from numba import types
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda import codegen
    from kernels_numba.gemm_wgmma import DEFAULT_TILE, gemm_wgmma_kernel
    from kernels_numba.wgmma import ptx_rewritten_for_sm90a, ptx_target

    class Hopper:
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Hopper()  # device functions ask the current device for its capability
    codegen.CUDACodeLibrary._ensure_cc = lambda library, cc: cc if cc is not None else (9, 0, "a")  # the H200's
    ptxas = os.environ.get("TINYVLLM_PTXAS") or shutil.which("ptxas")
    nvdisasm = os.environ.get("TINYVLLM_NVDISASM") or shutil.which("nvdisasm")
    argtypes = (types.Array(types.uint16, 2, "C"), types.Array(types.uint16, 2, "C"),
                types.Array(types.uint16, 2, "C"), types.Array(types.uint16, 2, "C"),
                types.Array(types.float32, 2, "C"))
    failures = 0
    for route in routes:
        kernel = gemm_wgmma_kernel(DEFAULT_TILE, route)
        with ptx_rewritten_for_sm90a() if route == "ptx" else contextlib.nullcontext():
            library = dispatcher._Kernel(kernel.py_func, argtypes, **kernel.targetoptions)._codelibrary
            ptx = library.get_asm_str()
            try:
                cubin = bytes(library.get_cubin().code)
            except Exception as e:  # noqa: BLE001 (no linker here: ptxas below still assembles it)
                cubin = None
                link_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        line = f"{route}: PTX {ptx_target(ptx)}, {ptx.count('wgmma.mma_async')} wgmma.mma_async"
        with tempfile.TemporaryDirectory() as folder:
            if ptxas:
                Path(folder, "k.ptx").write_text(ptx)
                done = subprocess.run([ptxas, "-v", "-arch=sm_90a", f"{folder}/k.ptx", "-o", f"{folder}/p.cubin"],
                                      capture_output=True, text=True)
                registers = re.search(r"Used (\d+) registers", done.stderr)
                frame = re.search(r"\d+ bytes stack frame, \d+ bytes spill stores, \d+ bytes spill loads", done.stderr)
                warnings = [w for w in done.stderr.splitlines() if "warning" in w.lower()]
                line += (f"; ptxas {'OK' if done.returncode == 0 else 'FAILED'}: "
                         f"{registers.group(1) if registers else '?'} registers, {frame.group(0) if frame else '?'}"
                         + "".join(f"\n  {w}" for w in warnings))
                if done.returncode:
                    line += "\n" + done.stderr[-2000:]
                    failures += 1
            else:
                line += "; no ptxas (PATH or TINYVLLM_PTXAS)"
            if cubin is None:
                line += f"; numba's link: not here ({link_error})"
            elif nvdisasm:
                Path(folder, "k.cubin").write_bytes(cubin)
                sass = subprocess.run([nvdisasm, "-c", f"{folder}/k.cubin"], capture_output=True, text=True).stdout
                counts = {op: _count(sass, op) for op in ("HGMMA", "LDGSTS", "LDL", "STL")}
                line += "; numba's link: SASS " + ", ".join(f"{op} {n}" for op, n in counts.items())
                failures += counts["HGMMA"] == 0
            else:
                line += f"; numba's link: a {len(cubin)}-byte cubin (no nvdisasm for its SASS)"
        print(line, flush=True)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", default="numba,ptx", help="comma-separated: numba, ptx (default both)")
    parser.add_argument("--offline", action="store_true",
                        help="no GPU: each route's PTX for sm_90a, ptxas on it, numba's link and its SASS where found")
    parser.add_argument("--budget-s", type=float, default=540,
                        help="stop starting checks this many seconds in (default 540: one 10-minute device call)")
    parser.add_argument("--no-pytest", action="store_true", help="skip the GPU run of tests/test_wgmma.py (last)")
    parser.add_argument("--check", choices=sorted(CHECKS), help=argparse.SUPPRESS)
    parser.add_argument("--route", default="numba", help=argparse.SUPPRESS)
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    if not routes or set(routes) - set(ROUTES):
        parser.error(f"--routes takes a comma-separated subset of {','.join(ROUTES)}, got {args.routes!r}")
    if args.check:
        return child(args.check, args.route)
    if args.offline:
        return offline(routes)
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("wgmma_smoke: unset NUMBA_ENABLE_CUDASIM (it runs on the GPU; --offline compiles without one)")
    deadline = time.monotonic() + args.budget_s
    results = {}

    def step(label, run):
        left = deadline - time.monotonic()
        if left < 20:
            print(f"\n==== {label}: skipped (the --budget-s of {args.budget_s} s is spent) ====")
            results[label] = False
            return
        results[label] = run(min(CHILD_TIMEOUT_S, left))

    step("env", lambda t: run_child("env", routes[0], t))
    for route in routes:
        for name in ("compile", "single", "gemm"):
            step(f"{name}:{route}", lambda t, name=name, route=route: run_child(name, route, t))
    timed = next((r for r in routes if results.get(f"gemm:{r}")), None)
    if timed:
        step(f"time:{timed}", lambda t: run_child("time", timed, t))
    else:
        print("\n==== time: skipped (no route passed gemm) ====")
    if not args.no_pytest:
        def pytest(t):
            print("\n==== pytest: TINYVLLM_TEST_GPU=1 tests/test_wgmma.py ====", flush=True)
            return _run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "tests/test_wgmma.py"],
                        t, "pytest", env={**os.environ, "TINYVLLM_TEST_GPU": "1"})
        step("pytest tests/test_wgmma.py", pytest)
    print("\n==== summary ====")
    for name, ok in results.items():
        print(f"{name}: {'PASS' if ok else 'FAIL'}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
