"""gemm_tc (or prefill_tc) compiled for sm_90 (the H200) on a machine without a GPU: registers, spills and the main
loop's instructions.

    python scripts/offline_sass.py [--tiles 128x128x64x2x2x3,64x128x64x2x2x3] [--residual] [--split] [--swiglu]
    python scripts/offline_sass.py --prefill-tc [16,32]

What a kernel costs per K slice is in its SASS: integer work around the HMMAs (64-bit index arithmetic around
every cp.async and ldmatrix) shows as extra instructions in the main loop, before any GPU call. For each tile: numba compiles the kernel to PTX for compute capability 9.0 (no driver needed once device
functions are told the capability), ptxas assembles it (registers, spill bytes), and, with nvdisasm, the loop that
holds the HMMAs is found (the backward branch whose body has the most of them) and its instructions counted by
opcode. --prefill-tc does the same for prefill_tc's kernel as the fast precision launches it for Llama-3.2-1B (bf16
pool, head_dim 64, group 4, TC_WARPS warps, TC_KEY_TILE-key tiles; the pool's block size 16 as EngineConfig's
default), whose main loop is the key-tile loop (64 HMMA a tile at that shape). The counts measured so far, and
what cutting the index work to 32 bits saved: docs/bench-h200.md (Offline SASS).

Tools (not dependencies of tinyvllm; pip wheels in a scratch venv are enough): ptxas (nvidia-cuda-nvcc), nvdisasm
(nvidia-cuda-nvdisasm), and an NVRTC library numba loads while compiling (nvidia-cuda-nvrtc: put its lib folder on
LD_LIBRARY_PATH). Found on PATH, or named by TINYVLLM_PTXAS / TINYVLLM_NVDISASM. Without nvdisasm only ptxas's
figures are printed. Run it with NUMBA_ENABLE_CUDASIM unset: it compiles for the real target.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OPCODE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9]*)")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")


def tool(name: str, env: str) -> str | None:
    return os.environ.get(env) or shutil.which(name)


def main_loop(sass: str) -> collections.Counter:
    """Opcode counts of the backward branch's body with the most HMMA (empty if none)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    best = collections.Counter()
    for i, line in enumerate(lines):
        m = BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            body = collections.Counter(o.group(1) for line in lines[labels[m.group(1)]:i + 1]
                                       if (o := OPCODE.match(line)))
            if body["HMMA"] > best["HMMA"]:
                best = body
    return best


def measure(name: str, py_func, signature, ptxas: str, nvdisasm: str | None) -> str | None:
    """One kernel for sm_90: ptxas's registers and spills, and (with nvdisasm) its main loop's instruction mix; None
    when ptxas fails (its error printed)."""
    from numba import cuda
    ptx, _ = cuda.compile_ptx(py_func, signature, cc=(9, 0))
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "k.ptx").write_text(ptx)
        done = subprocess.run([ptxas, "-v", "-arch=sm_90", f"{folder}/k.ptx", "-o", f"{folder}/k.cubin"],
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{name}: ptxas failed\n{done.stderr[-2000:]}")
            return None
        registers = re.search(r"Used (\d+) registers", done.stderr)
        spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", done.stderr)
        line = (f"{name}: {registers.group(1) if registers else '?'} registers, spill stores / loads "
                f"{' / '.join(spills) or '?'} bytes")
        if nvdisasm:
            sass = subprocess.run([nvdisasm, "-c", f"{folder}/k.cubin"], capture_output=True, text=True).stdout
            loop = main_loop(sass)
            mix = ", ".join(f"{opcode} {n}" for opcode, n in loop.most_common(8))
            line += f"; main loop {sum(loop.values())} instructions for {loop['HMMA']} HMMA ({mix})"
    return line


def gemm_tc_kernels(args):
    """(name, py_func, signature) of gemm_tc for each of --tiles."""
    from numba import types
    from kernels_numba.gemm_tc import TileShape, gemm_tc_kernel
    bits, floats = types.Array(types.uint16, 2, "C"), types.Array(types.float32, 2, "C")
    outs = bits if args.swiglu else floats  # (the SwiGLU launch passes its bf16 out as all three)
    signature = (bits, bits, bits, bits, outs, outs, outs)  # x, W, their flat views, out, residual in / out
    for spec in args.tiles.split(","):
        tile = TileShape(*(int(v) for v in spec.split("x")))
        yield spec, gemm_tc_kernel(tile, args.residual, args.split, args.swiglu).py_func, signature


def prefill_tc_kernels(args):
    """(name, py_func, signature) of prefill_tc with a bf16 pool and TC_OPTIONS, at Llama-3.2-1B's shape (head_dim
    64, group 4) for each of --prefill-tc's block sizes, with the launcher's defaults (TC_WARPS, TC_KEY_TILE)."""
    from numba import types
    from kernels_numba.attention.prefill_tc import (TC_KEY_TILE, TC_OPTIONS, TC_WARPS,
                                                    paged_attention_prefill_tc_kernel, tc_key_tile)
    head_dim, group = 64, 4
    keys = tc_key_tile(head_dim, TC_WARPS, TC_KEY_TILE)
    ints, int_rows = types.Array(types.int32, 1, "C"), types.Array(types.int32, 2, "C")
    floats3, bits = types.Array(types.float32, 3, "C"), types.Array(types.uint16, 2, "C")
    # q, k_rows, v_rows, block_tables, tile_seq, tile_tokens, tile_positions, tile_key_len, scale, out (the launch's
    # types: tiles and block tables are whole int32 device arrays, the pools' reshaped views C-contiguous)
    signature = (floats3, bits, bits, int_rows, ints, int_rows, int_rows, ints, types.float32, floats3)
    for block_size in (int(b) for b in args.prefill_tc.split(",")):
        kernel = paged_attention_prefill_tc_kernel(head_dim, group, block_size, TC_WARPS, keys, True, TC_OPTIONS)
        yield (f"prefill_tc head_dim {head_dim} group {group} block_size {block_size} bf16 pool {TC_WARPS} warps "
               f"{keys}-key tiles", kernel.py_func, signature)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", default="128x128x64x2x2x3,64x128x64x2x2x3,64x64x32x2x2x4",
                        help="block m x n x k x warps m x warps n x stages, comma-separated")
    parser.add_argument("--residual", action="store_true", help="the residual epilogue's kernel")
    parser.add_argument("--split", action="store_true", help="the split-K kernel")
    parser.add_argument("--swiglu", action="store_true", help="the SwiGLU epilogue's kernel (bf16 out)")
    parser.add_argument("--prefill-tc", metavar="BLOCK_SIZES", nargs="?", const="16",
                        help="measure prefill_tc (bf16 pool, head_dim 64, group 4) instead, at these pool block "
                             "sizes (comma-separated; 16, the engine's default, when given bare)")
    args = parser.parse_args()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("offline_sass: unset NUMBA_ENABLE_CUDASIM (it compiles for the GPU, not the simulator)")
    ptxas, nvdisasm = tool("ptxas", "TINYVLLM_PTXAS"), tool("nvdisasm", "TINYVLLM_NVDISASM")
    if ptxas is None:
        sys.exit("offline_sass: no ptxas on PATH and no TINYVLLM_PTXAS (pip install nvidia-cuda-nvcc in a scratch venv)")
    import numba.cuda.dispatcher as dispatcher

    class Hopper:
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Hopper()  # device functions ask the current device for its capability
    for name, py_func, signature in (prefill_tc_kernels if args.prefill_tc else gemm_tc_kernels)(args):
        line = measure(name, py_func, signature, ptxas, nvdisasm)
        if line is None:
            return 1
        print(line, flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
