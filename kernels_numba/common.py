"""What every kernel file shares: the `cuda` module, which side we run on, and a jit that works on both.

numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set before numba is imported) runs one Python thread per
CUDA thread. It has no warp shuffles and rejects some jit options, so kernels use shared-memory
reductions and this `jit` drops the options the simulator does not know.

On a GPU every kernel made by this `jit` is cached on disk (numba's cache=True), so a second process
loads the compiled code instead of compiling it again (~30 s saved per start). numba checks a cached kernel
against its own source file only, not the device functions it calls from other files, so the cache lives
in a directory named by a digest of every source file of this package: `kernel_cache_dir()`,
$XDG_CACHE_HOME/tinyvllm/numba/<digest> (~/.cache when XDG_CACHE_HOME is unset; numba's default, __pycache__
beside the sources, fails in a read-only site-packages). A NUMBA_CACHE_DIR set by the user is used as it is.

No module here may have "numba.cuda" in its dotted name (e.g. kernels_numba.cuda_x): numba-cuda's
import redirector hijacks such names and recurses forever.
"""
import hashlib
import math
import os
import sys
import threading
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .gpu_probe import choose_simulator_without_gpu

choose_simulator_without_gpu()  # no GPU and NUMBA_ENABLE_CUDASIM unset: the simulator, with a notice
from numba import cuda  # noqa: E402

SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)
# Shared tiles read four floats at a time: 16-byte aligned arrays whose rows are padded by 4 floats (rows stay
# aligned, and thread j reading row j hits banks 4j..4j+3 mod 32). The simulator rejects an alignment argument.
SHARED_ALIGN = None if SIMULATOR else 16
SHARED_ROW_PAD = 4


def _serialise_simulated_shared_arrays() -> None:
    """The simulator hands each block's threads one shared array per source line, created by whichever
    thread gets there first: `get` then `set` on a dict, with no lock. Two threads switching between the
    two make two arrays, and the block silently computes with a private copy (seen as a rare, load-
    dependent test failure). Same lookup, under a lock; it also reads one stack frame, not the whole stack.
    Dynamic shared memory (shape 0: one buffer of the launch's size, shared by every thread) stays the simulator's."""
    import threading
    import traceback

    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support
    from numba.core import types as numba_types

    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:  # the simulator's error
            return original(self, shape, dtype, alignment)
        if shape == 0:  # dynamic shared memory, the simulator's (which reads an itemsize off `dtype`: a numpy dtype)
            return original(self, shape, np.dtype(dtype) if isinstance(dtype, type) else dtype)
        if isinstance(dtype, numba_types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[0][0:2])  # (file, line)
        with lock:
            allocation = self._allocations.get(caller)
            if allocation is None:
                allocation = self._allocations[caller] = np.empty(shape, dtype)
        return allocation

    kernelapi.FakeCUDAShared.array = array


if SIMULATOR:
    _serialise_simulated_shared_arrays()
    # A simulated syncthreads waits until every thread of the block has been scheduled by the GIL; the
    # default 5 ms switch interval makes each barrier cost milliseconds per thread (0.2 ms: ~4x faster).
    sys.setswitchinterval(2e-4)

_GPU_ONLY_OPTIONS = ("lineinfo", "launch_bounds", "max_registers", "lto", "forceinline")


_OUR_CACHE_DIR = "TINYVLLM_KERNEL_CACHE_DIR"  # the NUMBA_CACHE_DIR we set, which child processes inherit


def kernel_cache_dir(environ=os.environ, package: Path = Path(__file__).parent) -> Path:
    """Where compiled kernels are cached: NUMBA_CACHE_DIR if the user set it, else $XDG_CACHE_HOME/tinyvllm/numba/<a
    digest of this package's sources> (a kernel calls device functions from other files, which numba does not
    check). A NUMBA_CACHE_DIR a tinyvllm process set for itself and passed on to a child is not the user's."""
    user_dir = environ.get("NUMBA_CACHE_DIR")
    if user_dir and user_dir != environ.get(_OUR_CACHE_DIR):
        return Path(user_dir)
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    root = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "tinyvllm" / "numba" / digest.hexdigest()[:16]


def _use_kernel_cache() -> bool:
    """Point numba's cache at kernel_cache_dir() (before any kernel is made: each picks its cache directory when
    decorated); False, caching nothing, where that directory cannot be created."""
    try:
        path = kernel_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: no home directory
        return False
    if os.environ.get("NUMBA_CACHE_DIR") != str(path):
        os.environ["NUMBA_CACHE_DIR"] = os.environ[_OUR_CACHE_DIR] = str(path)  # numba re-reads the environment
        from numba.cuda.core import config as numba_config
        numba_config.reload_config()
    return True


CACHE_KERNELS = not SIMULATOR and _use_kernel_cache()
_KERNELS: list = []  # every kernel jit made on the GPU, for kernel_cache_stats


def kernel_cache_stats() -> tuple[int, int]:
    """(compilations, loads from the disk cache) of every kernel so far in this process (GPU only)."""
    compiled = sum(sum(k.stats.cache_misses.values()) for k in _KERNELS)
    loaded = sum(sum(k.stats.cache_hits.values()) for k in _KERNELS)
    return compiled, loaded


_PYTHON_BODIES: dict[int, object] = {}  # id(GPU device function) -> the Python function it was made from


def jit(*args, **options):
    """`cuda.jit` with GPU-only options filtered out in the simulator, and kernels cached on disk on a GPU
    (CACHE_KERNELS; not device functions, which are compiled into each kernel that calls them, nor kernels that
    link external code, which numba cannot cache).

    In the simulator a device function (`device=True`) stays a plain Python function: the simulator's
    device-function wrapper costs ~6 us a call, which would make every bf16 weight decode the slowest thing in a
    forward pass. So device functions must be pure arithmetic (no `cuda.*` inside); kernels may use anything.
    On the GPU their Python bodies stay reachable through `host_version`, for the numpy twins.
    """
    if SIMULATOR and options.get("device"):
        return (lambda fn: fn) if not args else args[0]
    if SIMULATOR:
        for name in _GPU_ONLY_OPTIONS:
            options.pop(name, None)
        options.pop("cache", None)
    if options.get("device") and args and callable(args[0]):
        return jit(**options)(args[0])
    if options.get("device"):
        def device_function(fn):
            compiled = cuda.jit(*args, **options)(fn)
            _PYTHON_BODIES[id(compiled)] = fn
            return compiled
        return device_function
    if SIMULATOR:
        return cuda.jit(*args, **options)
    if "link" not in options:
        options.setdefault("cache", CACHE_KERNELS)
    if args and callable(args[0]):
        return _registered(cuda.jit(*args, **options))

    def kernel_of(fn):
        return _registered(cuda.jit(*args, **options)(fn))
    return kernel_of


def _registered(kernel):
    """A GPU kernel counted in kernel_cache_stats; one made in a factory (a closure) keyed for the disk cache by
    closure_key, which stays the same from process to process where numba's own key did not."""
    if kernel.py_func.__closure__ and type(getattr(kernel, "_cache", None)).__name__ == "CUDACache":
        from .closure_key import stable_closure_cache
        kernel._cache = stable_closure_cache(kernel.py_func)
    _KERNELS.append(kernel)
    return kernel


def host_version(device_function):
    """A device function as plain Python callable on the host (and on numpy arrays), calling the host
    versions of the device functions it uses: numpy twins share the kernels' exact arithmetic."""
    body = _PYTHON_BODIES.get(id(device_function))
    if body is None:  # the simulator, or not a device function: already plain Python
        return device_function
    return _host_namespace(body.__globals__)[body.__name__]


_HOST_NAMESPACES: dict[int, dict] = {}


def _host_namespace(module_globals: dict) -> dict:
    """A copy of a module's globals where every GPU device function is its plain Python body (built once
    per module and shared, so device functions calling each other resolve without recursion)."""
    key = id(module_globals)
    if key not in _HOST_NAMESPACES:
        namespace = _HOST_NAMESPACES[key] = dict(module_globals)
        for name, value in module_globals.items():
            body = _PYTHON_BODIES.get(id(value))
            if body is None:
                continue
            if body.__globals__ is module_globals:
                namespace[name] = types.FunctionType(body.__code__, namespace, body.__name__,
                                                     body.__defaults__, body.__closure__)
            else:  # imported from another kernel module
                namespace[name] = _host_namespace(body.__globals__)[body.__name__]
    return _HOST_NAMESPACES[key]


def device_function_with_cuda(fn):
    """A device function that calls cuda.* (barriers, fences, atomics, thread indices). `jit` keeps device functions
    plain Python in the simulator (pure arithmetic only), where cuda.* resolves only inside the kernel's own module;
    this makes it the simulator's own device function there, which runs it with the simulator's cuda module."""
    return cuda.jit(device=True)(fn) if SIMULATOR else jit(device=True)(fn)


if SIMULATOR:
    @cuda.jit(device=True)  # the simulator's own device function (not this module's jit): it may call cuda.*
    def warp_barrier():
        cuda.syncthreads()
else:
    @jit(device=True)
    def warp_barrier():
        cuda.syncwarp()
warp_barrier.__doc__ = """Every lane of the calling warp waits here, and sees the others' shared-memory writes made before it.

On the GPU `cuda.syncwarp()` (bar.warp.sync, full mask: all 32 lanes must call it). The simulator has no
syncwarp, so there it is `cuda.syncthreads()`, which waits for the whole block: the same guarantee and more,
PROVIDED every thread of the block calls warp_barrier the same number of times (a kernel whose warps loop a
warp-dependent number of times would hang in the simulator). Kernels that use it keep their loop counts
uniform across the block."""


# In the simulator a thread costs ~0.3 ms to start and a loop iteration ~2 us, and nothing runs in
# parallel: grid-stride kernels get a small grid there (2 blocks x 4 threads, so block and grid
# striding are still exercised) and one thread per item on the GPU.
SIMULATOR_GRID = (2, 4)


def grid_stride_launch(n_items: int, threads_per_block: int = 256) -> tuple[int, int]:
    """(blocks, threads) for a kernel that loops `for i in range(cuda.grid(1), n_items, cuda.gridsize(1))`."""
    if SIMULATOR:
        return SIMULATOR_GRID
    return max(1, cdiv(n_items, threads_per_block)), threads_per_block


def rows_launch(n_rows: int, n_cols: int, threads_per_block: int = 256) -> tuple[tuple[int, int], int]:
    """((blocks x, blocks y), threads) for a kernel that strides rows over the grid's y and columns over its x."""
    if SIMULATOR:
        return (SIMULATOR_GRID[0], 2), SIMULATOR_GRID[1]
    return (max(1, cdiv(n_cols, threads_per_block)), max(1, min(n_rows, 65535))), threads_per_block


def flat_rows(*arrays):
    """Each C-contiguous device array as one row [1, size], for kernels that index an operand flat from a
    per-thread start (gemm_tc's copies of x and W, prefill_tc's of the KV pools)."""
    return tuple(a.reshape(1, a.size) for a in arrays)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_two(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


class BufferArena:
    """The output buffers of one recorded step, handed out again, in the same order, on every replay.

    A CUDA graph bakes in the addresses of everything its kernels touch, so a captured forward pass must
    write into the same buffers each time it is replayed, and they must outlive the graph. Recording runs
    the step eagerly and keeps every buffer its launchers asked for; `rewind` makes the next pass get
    those same buffers back (same shapes and dtypes, asserted), so nothing is allocated while capturing.
    """

    def __init__(self):
        self.buffers: list = []
        self._next: int | None = None  # None while recording

    def take(self, shape, dtype, zeroed: bool = False):
        """The next buffer: while recording a new one (all zeros if `zeroed`, else uninitialised); on a
        replay the recorded one, as the last pass left it."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if self._next is None:
            buffer = cuda.to_device(np.zeros(shape, dtype)) if zeroed else cuda.device_array(shape, dtype)
            self.buffers.append(buffer)
            return buffer
        assert self._next < len(self.buffers), "the replayed step asks for more buffers than it recorded"
        buffer = self.buffers[self._next]
        assert buffer.shape == shape and buffer.dtype == np.dtype(dtype), (
            f"buffer {self._next}: recorded {buffer.shape} {buffer.dtype}, replay asks {shape} {np.dtype(dtype)}")
        self._next += 1
        return buffer

    def rewind(self) -> None:
        self._next = 0

    def begin_layer(self, i: int) -> None:
        """The forward pass starts layer i: a plain arena keeps every buffer apart (LayerArena reuses them)."""

    @property
    def bytes(self) -> int:
        return sum(b.size * b.dtype.itemsize for b in self.buffers)


class LayerArena(BufferArena):
    """A BufferArena that reuses memory across layers: layer i's buffers come from set i % 2 (what runs before
    begin_layer(0), the embedding and layer 0's input norm, from set 1), the k-th buffer of a dtype a layer takes
    being the same storage in every layer of its set. Layer i + 1 reads only layer i's outputs (its residual h and
    normed x), never layer i - 1's, so it may overwrite all of set (i + 1) % 2. The storage (SharedStorage) may serve several arenas whose steps
    never run at the same time (prefill graphs replayed one after another on one stream): a buffer is a view of the
    first elements of a flat array, grown (a new array; views of the old one keep it alive) when a step needs more.
    The forward pass marks each layer's start with begin_layer(i). Zeroed buffers (counters) are never shared."""

    def __init__(self, storage: "SharedStorage"):
        super().__init__()
        self.storage = storage
        self._set, self._counts = 1, {}

    def begin_layer(self, i: int) -> None:
        self._set, self._counts = i % 2, {}

    def take(self, shape, dtype, zeroed: bool = False):
        if self._next is not None or zeroed:
            return super().take(shape, dtype, zeroed)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        kind = (self._set, np.dtype(dtype).str)
        index = self._counts[kind] = self._counts.get(kind, -1) + 1
        buffer = self.storage.view((*kind, index), shape, dtype)
        self.buffers.append(buffer)
        return buffer


class SharedStorage:
    """Flat device arrays by key, handed out as views of their first elements (LayerArena's storage)."""

    def __init__(self):
        self._flat: dict = {}

    def view(self, key, shape: tuple, dtype):
        size = int(np.prod(shape))
        flat = self._flat.get(key)
        if flat is None or flat.size < size:
            flat = self._flat[key] = cuda.device_array(size, dtype)
            if SIMULATOR:  # poisoned (every byte 0xFF: NaN in float32): an element read before written shows
                flat.copy_to_device(np.full(size * np.dtype(dtype).itemsize, 0xFF, np.uint8).view(dtype))
        return flat[:size].reshape(shape)

    @property
    def bytes(self) -> int:
        """What the current arrays hold (outgrown ones live on while a graph that baked them in does)."""
        return sum(f.size * f.dtype.itemsize for f in self._flat.values())


class _LaunchTarget(threading.local):
    stream = 0                          # 0: the default stream; a cuda.core GraphBuilder while capturing
    buffers: BufferArena | None = None  # where launchers' outputs come from; None: fresh allocations


_target = _LaunchTarget()


def launch_stream():
    """The stream every launcher launches on (kernel[grid, block, launch_stream()])."""
    return _target.stream


STATIC_SHARED_LIMIT = 48 * 1024  # the shared memory any kernel may have a block without opting in
_SHARED_OPT_INS: dict = {}  # a kernel overload's loaded function (one per device) -> the dynamic bytes it may use


def launch_with_shared(kernel, grid, threads, shared_bytes: int, *args) -> None:
    """kernel[grid, threads, launch_stream(), shared_bytes](*args): a launch with `shared_bytes` of dynamic shared
    memory (`cuda.shared.array(0, dtype)` in the kernel). Past 48 KB a kernel must opt in, per loaded function on
    each device: the overload these arguments launch is compiled (or found) first and allowed `shared_bytes`
    (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), once; later launches, a CUDA graph's capture included, find
    it done (a capture's eager recording runs first), at the cost of typing the arguments once more (microseconds).
    Setting it is no stream operation, so it is legal while a stream captures anyway. A no-op in the simulator."""
    if shared_bytes > STATIC_SHARED_LIMIT and not SIMULATOR:
        _allow_dynamic_shared(kernel, args, shared_bytes)
    kernel[grid, threads, launch_stream(), shared_bytes](*args)


def _allow_dynamic_shared(kernel, args, shared_bytes: int) -> None:
    overload = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))  # the _Kernel the launch will take
    function = overload._codelibrary.get_cufunc()  # loaded on the current device
    if _SHARED_OPT_INS.get(function, 0) >= shared_bytes:
        return
    device = function.device
    limit = device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    name = getattr(kernel, "__qualname__", kernel)
    assert shared_bytes <= limit, (
        f"{name}: {shared_bytes} B of shared memory a block, over the {limit} B this GPU ({device.name}) allows one")
    _set_max_dynamic_shared(function, shared_bytes)
    _SHARED_OPT_INS[function] = shared_bytes


def _set_max_dynamic_shared(function, shared_bytes: int) -> None:
    """A loaded kernel's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES on its device, the way numba-cuda sets a
    kernel's shared memory carveout (CudaPythonFunction.set_shared_memory_carveout)."""
    from numba.cuda.cudadrv.driver import binding, driver
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attribute, shared_bytes, function.handle, function.device.id)


def device_empty(shape, dtype):
    """A launcher's output buffer: a fresh device array, or the current BufferArena's."""
    if _target.buffers is None:
        return cuda.device_array(shape, dtype)
    return _target.buffers.take(shape, dtype)


def device_zeros(shape, dtype):
    """A launcher's buffer that must start as zeros: zeroed when allocated (a fresh array, or the current
    BufferArena's while it records), then handed back on every replay as the kernels left it. For counters
    the kernels themselves return to zero, so a captured step needs no memset of its own."""
    if _target.buffers is None:
        return cuda.to_device(np.zeros(shape, dtype))
    return _target.buffers.take(shape, dtype, zeroed=True)


def begin_layer(i: int) -> None:
    """The forward pass starts layer i: tells the current arena (a LayerArena reuses buffers by layer)."""
    if _target.buffers is not None:
        _target.buffers.begin_layer(i)


@contextmanager
def launching_into(stream=0, buffers: BufferArena | None = None):
    """Launch on `stream` and take outputs from `buffers` inside the block (this thread only)."""
    saved = _target.stream, _target.buffers
    _target.stream, _target.buffers = stream, buffers
    try:
        yield
    finally:
        _target.stream, _target.buffers = saved
