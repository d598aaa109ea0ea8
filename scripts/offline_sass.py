"""gemm_tc compiled for the H200 (sm_90) on a machine without a GPU: registers, spills and the main loop's instructions.

    python scripts/offline_sass.py [--tiles 128x128x64x2x2x3,64x128x64x2x2x3] [--residual] [--split] [--swiglu]

What a kernel costs per K slice is in its SASS: Round 10 found gemm_tc's main loop issuing 373 instructions for its
64 HMMA (64-bit index arithmetic around every cp.async and ldmatrix) this way, and cut it to 208, before any GPU
call. For each tile: numba compiles the kernel to PTX for compute capability 9.0 (no driver needed once device
functions are told the capability), ptxas assembles it (registers, spill bytes), and, with nvdisasm, the loop that
holds the HMMAs is found (the backward branch whose body has the most of them) and its instructions counted by
opcode.

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", default="128x128x64x2x2x3,64x128x64x2x2x3,64x64x32x2x2x4",
                        help="block m x n x k x warps m x warps n x stages, comma-separated")
    parser.add_argument("--residual", action="store_true", help="the residual epilogue's kernel")
    parser.add_argument("--split", action="store_true", help="the split-K kernel")
    parser.add_argument("--swiglu", action="store_true", help="the SwiGLU epilogue's kernel (bf16 out)")
    args = parser.parse_args()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("offline_sass: unset NUMBA_ENABLE_CUDASIM (it compiles for the GPU, not the simulator)")
    ptxas, nvdisasm = tool("ptxas", "TINYVLLM_PTXAS"), tool("nvdisasm", "TINYVLLM_NVDISASM")
    if ptxas is None:
        sys.exit("offline_sass: no ptxas on PATH and no TINYVLLM_PTXAS (pip install nvidia-cuda-nvcc in a scratch venv)")
    from numba import cuda, types
    import numba.cuda.dispatcher as dispatcher

    class Hopper:
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Hopper()  # device functions ask the current device for its capability
    from kernels_numba.gemm_tc import TileShape, gemm_tc_kernel
    bits, floats = types.Array(types.uint16, 2, "C"), types.Array(types.float32, 2, "C")
    outs = bits if args.swiglu else floats  # (the SwiGLU launch passes its bf16 out as all three)
    signature = (bits, bits, bits, bits, outs, outs, outs)  # x, W, their flat views, out, residual in / out
    for spec in args.tiles.split(","):
        tile = TileShape(*(int(v) for v in spec.split("x")))
        kernel = gemm_tc_kernel(tile, args.residual, args.split, args.swiglu)
        ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "k.ptx").write_text(ptx)
            done = subprocess.run([ptxas, "-v", "-arch=sm_90", f"{folder}/k.ptx", "-o", f"{folder}/k.cubin"],
                                  capture_output=True, text=True)
            if done.returncode:
                print(f"{spec}: ptxas failed\n{done.stderr[-2000:]}")
                return 1
            registers = re.search(r"Used (\d+) registers", done.stderr)
            spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", done.stderr)
            line = (f"{spec}: {registers.group(1) if registers else '?'} registers, spill stores / loads "
                    f"{' / '.join(spills) or '?'} bytes")
            if nvdisasm:
                sass = subprocess.run([nvdisasm, "-c", f"{folder}/k.cubin"], capture_output=True, text=True).stdout
                loop = main_loop(sass)
                mix = ", ".join(f"{name} {n}" for name, n in loop.most_common(8))
                line += f"; main loop {sum(loop.values())} instructions for {loop['HMMA']} HMMA ({mix})"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
