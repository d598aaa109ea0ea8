"""What every kernel file shares: the `cuda` module, which side we run on, and a jit that works on both.

numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set before numba is imported) runs one Python thread per
CUDA thread. It has no warp shuffles and rejects some jit options, so kernels use shared-memory
reductions and this `jit` drops the options the simulator does not know.

No module here may have "numba.cuda" in its dotted name (e.g. kernels_numba.cuda_x): numba-cuda's
import redirector hijacks such names and recurses forever.
"""
import math

from numba import cuda

SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)

_GPU_ONLY_OPTIONS = ("lineinfo", "launch_bounds", "max_registers", "lto", "forceinline")


def jit(*args, **options):
    """`cuda.jit` with GPU-only options filtered out in the simulator.

    In the simulator a device function (`device=True`) stays a plain Python function: the simulator's
    device-function wrapper costs ~6 us a call, which made every bf16 weight decode the slowest thing in a
    forward pass. So device functions must be pure arithmetic (no `cuda.*` inside); kernels may use anything.
    """
    if SIMULATOR and options.get("device"):
        return (lambda fn: fn) if not args else args[0]
    if SIMULATOR:
        for name in _GPU_ONLY_OPTIONS:
            options.pop(name, None)
        options.pop("cache", None)
    return cuda.jit(*args, **options)


# In the simulator a thread costs ~0.3 ms to start and a loop iteration ~2 us, and nothing runs in
# parallel: grid-stride kernels get a small grid there (2 blocks x 4 threads, so block and grid
# striding are still exercised) and one thread per item on the GPU.
SIMULATOR_GRID = (2, 4)


def grid_stride_launch(n_items: int, threads_per_block: int = 256) -> tuple[int, int]:
    """(blocks, threads) for a kernel that loops `for i in range(cuda.grid(1), n_items, cuda.gridsize(1))`."""
    if SIMULATOR:
        return SIMULATOR_GRID
    return max(1, cdiv(n_items, threads_per_block)), threads_per_block


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_two(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))
