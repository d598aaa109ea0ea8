"""Compile the kernels some host code will launch in several processes at once, instead of one by one at their
first launches (numba compiles under one global lock, so threads would not help). GPU only.

    with discovering() as misses:   # the host code runs; its launches launch nothing
        run_the_steps()
    payload = compile_payload(misses[i])            # in worker process i (which discovered the same list)
    install(misses[i], payload)                     # back here: loaded, and saved to the disk cache

`discovering()` lists, in launch order, each (kernel, argument types) that is neither compiled in this process nor
in the disk cache: a "miss". A process that runs the same host code on the same configuration discovers the same
list, so workers need only an index, and `identity` checks that a payload is for the kernel it is installed as.
A payload is what numba's disk cache stores for a kernel (`_Kernel._reduce_states()`, its cubin included), pickled;
`install` rebuilds the kernel from it as a cache load does, adds it to the dispatcher and saves it to the disk
cache (so the next start loads it). numba-cuda internals used (0.30): CUDADispatcher.call / overloads /
add_overload / targetoptions / targetctx / _cache (its index key, index file and locator), dispatcher._Kernel.
"""
from __future__ import annotations

import pickle
from contextlib import contextmanager
from dataclasses import dataclass

from . import common
from .closure_key import closure_digest


@dataclass(frozen=True)
class Miss:
    kernel: object        # the CUDADispatcher
    argtypes: tuple       # numba types of the launch's arguments


def identity(miss: Miss) -> tuple[str, str, str]:
    """What a miss is in any process: the kernel's function, its closure, the argument types."""
    function = miss.kernel.py_func
    return (f"{function.__module__}.{function.__qualname__}", closure_digest(function), str(miss.argtypes))


def _in_disk_cache(kernel, argtypes, indexes: dict) -> bool:
    cache = kernel._cache
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None:  # NullCache: not cached on disk; compiled ahead all the same
        return False
    if id(kernel) not in indexes:
        indexes[id(kernel)] = cache_file._load_index()
    return cache._index_key(argtypes, kernel.targetctx.codegen()) in indexes[id(kernel)]


@contextmanager
def discovering():
    """While inside, launches launch nothing (nor compile): each (kernel, argument types) neither compiled here nor
    in the disk cache is appended, once, to the list this yields. Host code reading device results back gets
    whatever the buffers held: run only code that launches (a CUDA graph's recording pass)."""
    from numba.cuda.dispatcher import CUDADispatcher

    assert not common.SIMULATOR, "compile-ahead is for the GPU (the simulator compiles nothing)"
    misses: list[Miss] = []
    seen: set = set()
    indexes: dict = {}

    def call(kernel, args, launch_config):
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        key = (id(kernel), argtypes)
        if key in seen:
            return
        seen.add(key)
        if argtypes not in kernel.overloads and not _in_disk_cache(kernel, argtypes, indexes):
            misses.append(Miss(kernel, argtypes))

    original_call, original_allow = CUDADispatcher.call, common._allow_dynamic_shared
    CUDADispatcher.call = call
    common._allow_dynamic_shared = lambda kernel, args, shared_bytes: None  # (it compiles to find the function)
    try:
        yield misses
    finally:
        CUDADispatcher.call, common._allow_dynamic_shared = original_call, original_allow


def compile_payload(miss: Miss) -> bytes:
    """Compile a miss as numba's CUDADispatcher.compile would (its cubin made for this device) and return what the
    disk cache would store for it, pickled."""
    from numba.cuda.dispatcher import _Kernel

    kernel = _Kernel(miss.kernel.py_func, miss.argtypes, **miss.kernel.targetoptions)
    kernel.bind()  # makes the cubin, which the payload carries
    return pickle.dumps(kernel._reduce_states(), protocol=pickle.HIGHEST_PROTOCOL)


def install(miss: Miss, payload: bytes) -> None:
    """A compiled miss from another process, loaded into its dispatcher here and saved to the disk cache."""
    from numba.cuda.dispatcher import _Kernel

    dispatcher = miss.kernel
    if miss.argtypes in dispatcher.overloads:
        return
    states = pickle.loads(payload)
    cache = dispatcher._cache
    if getattr(cache, "_cache_file", None) is not None and cache._enabled:  # as Cache._save_overload stores it
        cache._impl.locator.ensure_cache_path()
        cache._cache_file.save(cache._index_key(miss.argtypes, dispatcher.targetctx.codegen()), states)
    dispatcher.add_overload(_Kernel._rebuild(**states), miss.argtypes)
