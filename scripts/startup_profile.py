"""Where a server's start goes: `tinyvllm serve`'s engine built and every CUDA graph captured, as serve does before
its first request, in this process, with each kernel compile timed and charged to the phase that asked for it.

    python scripts/startup_profile.py --model DIR [engine options, e.g. --max-num-seqs 256] [--cache DIR]

The kernel cache is a fresh empty folder unless --cache names one (run twice with the same --cache for a warm
start). Prints the phases (imports, engine built, each decode / prefill bucket captured), then every compile
(kernel, its tile or options, seconds), the slowest first, and the totals: how much of the start compiling takes
and how it spreads over kernels (what compiling in parallel could win). GPU only.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", help="kernel cache root (XDG_CACHE_HOME); default a fresh empty folder")
    parser.add_argument("--top", type=int, default=40, help="compiles listed, slowest first (default 40)")
    args, engine_argv = parser.parse_known_args()
    cache = args.cache or tempfile.mkdtemp(prefix="tinyvllm-cold-")
    os.environ["XDG_CACHE_HOME"] = cache
    os.environ.pop("NUMBA_CACHE_DIR", None)
    sys.path.insert(0, str(REPO))

    from kernels_numba.common import SIMULATOR, kernel_cache_stats
    if SIMULATOR:
        sys.exit("startup_profile: a GPU measurement (the simulator compiles nothing)")
    from numba.cuda.dispatcher import CUDADispatcher
    import tinyvllm.cli.serve  # noqa: F401 (what serve imports)
    from tinyvllm.engine.args import add_engine_arguments, build_engine
    from tinyvllm.runner import cuda_graphs
    imported = time.perf_counter()

    phase = ["engine"]
    compiles = []  # (phase, kernel, signature, seconds)
    compile = CUDADispatcher.compile

    def timed_compile(self, sig):
        misses = sum(self._cache_misses.values())
        start = time.perf_counter()
        result = compile(self, sig)
        if sum(self._cache_misses.values()) > misses:
            cells = [c.cell_contents for c in (self.py_func.__closure__ or ())]
            options = [repr(c) for c in cells if type(c).__name__ in ("TileShape", "WgmmaTile", "bool", "int")]
            name = f"{self.py_func.__module__.rsplit('.', 1)[-1]}.{self.py_func.__qualname__.split('.<locals>')[0]}"
            compiles.append((phase[0], name, " ".join(options)[:80], time.perf_counter() - start))
        return result
    CUDADispatcher.compile = timed_compile

    capture = cuda_graphs.BucketGraphs._capture
    phases = []

    def timed_capture(self, bucket, quiet=False):
        kind = "decode" if isinstance(self, cuda_graphs.DecodeGraphs) else "prefill"
        phase[0] = f"{kind} {bucket}"
        start = time.perf_counter()
        step = capture(self, bucket, quiet)
        phases.append((phase[0], time.perf_counter() - start))
        return step
    cuda_graphs.BucketGraphs._capture = timed_capture

    engine_parser = argparse.ArgumentParser()
    add_engine_arguments(engine_parser)
    engine_args = engine_parser.parse_args(engine_argv)
    start = time.perf_counter()
    engine = build_engine(engine_args)
    built = time.perf_counter()
    phases.insert(0, ("engine built (weights loaded)", built - start))
    engine.capture_graphs(lambda message: print(f"  {message}", flush=True))
    ready = time.perf_counter()
    compiled, loaded = kernel_cache_stats()

    print(f"\ncache {cache}: {compiled} kernels compiled, {loaded} loaded from the cache")
    print(f"imports {imported - T0:.1f} s; engine built {built - imported:.1f} s; graphs captured "
          f"{ready - built:.1f} s; ready {ready - T0:.1f} s after start")
    print("\nphases (seconds, of which compiling):")
    by_phase = defaultdict(float)
    for where, _, _, seconds in compiles:
        by_phase[where] += seconds
    for where, seconds in phases:
        print(f"  {where:32s} {seconds:7.2f}  {by_phase.get('engine' if where.startswith('engine') else where, 0):7.2f}")
    total = sum(c[3] for c in compiles)
    print(f"\n{len(compiles)} compiles, {total:.1f} s in all; slowest first:")
    for where, name, options, seconds in sorted(compiles, key=lambda c: -c[3])[:args.top]:
        print(f"  {seconds:6.2f} s  {name:40s} {options:80s} [{where}]")
    by_kernel = defaultdict(lambda: [0, 0.0])
    for _, name, _, seconds in compiles:
        by_kernel[name][0] += 1
        by_kernel[name][1] += seconds
    print("\nby kernel (compiles, seconds):")
    for name, (count, seconds) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:48s} {count:4d} {seconds:7.2f}")
    print(f"\nSTARTUP ready_s={ready - T0:.2f} compile_s={total:.2f} compiles={len(compiles)} "
          f"longest_compile_s={max((c[3] for c in compiles), default=0):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
