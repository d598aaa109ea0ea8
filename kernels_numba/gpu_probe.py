"""Is a CUDA GPU usable here? Asked of the driver library through ctypes, before numba.cuda is imported.

numba decides between the GPU and its simulator once, when numba.cuda is imported, from
NUMBA_ENABLE_CUDASIM; without a usable driver that import works but the first launch fails with a
CudaSupportError. `choose_simulator_without_gpu()` (called by kernels_numba.common before its import)
turns that into a choice: with NUMBA_ENABLE_CUDASIM unset and no usable GPU, it sets the variable to 1 and
says so on stderr, once. (This module's name must not contain "numba.cuda": see common.py.)
"""
from __future__ import annotations

import ctypes
import os
import sys

ENV = "NUMBA_ENABLE_CUDASIM"


def _driver_library_names() -> list[str]:
    if os.environ.get("NUMBA_CUDA_DRIVER"):  # numba's own override of the driver's path
        return [os.environ["NUMBA_CUDA_DRIVER"]]
    if sys.platform == "win32":
        return ["nvcuda.dll"]
    if sys.platform == "darwin":
        return []
    return ["libcuda.so.1", "libcuda.so"]


def gpu_problem() -> str | None:
    """Why no CUDA GPU can be used (one short phrase), or None when the driver sees at least one device."""
    driver, failures = None, []
    for name in _driver_library_names():
        try:
            driver = ctypes.CDLL(name)
            break
        except OSError as e:
            failures.append(str(e))
    if driver is None:
        return f"cannot load the CUDA driver: {failures[0]}" if failures else f"no CUDA driver on {sys.platform}"
    status = driver.cuInit(0)
    if status != 0:
        return f"cuInit failed: {_error_name(driver, status)}"
    count = ctypes.c_int(0)
    status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return f"cuDeviceGetCount failed: {_error_name(driver, status)}"
    return None if count.value > 0 else "the CUDA driver sees no device"


def _error_name(driver, status: int) -> str:
    text = ctypes.c_char_p()
    if driver.cuGetErrorString(status, ctypes.byref(text)) == 0 and text.value:
        return f"{text.value.decode(errors='replace')} (CUDA error {status})"
    return f"CUDA error {status}"


def choose_simulator_without_gpu(stderr=None) -> bool:
    """With NUMBA_ENABLE_CUDASIM unset, no numba.cuda imported yet and no usable GPU: set it to 1 and print
    a one-line notice. Returns whether it did. An explicit NUMBA_ENABLE_CUDASIM (0 or 1) is left alone."""
    if ENV in os.environ or "numba.cuda" in sys.modules:
        return False
    problem = gpu_problem()
    if problem is None:
        return False
    os.environ[ENV] = "1"
    if "numba.core.config" in sys.modules:  # numba read its settings when imported: read them again
        sys.modules["numba.core.config"].reload_config()
    print(f"tinyvllm: no CUDA GPU found ({problem}); running in numba's CUDA simulator (slow). "
          f"Set {ENV}=1 to silence this.", file=stderr or sys.stderr)
    return True
