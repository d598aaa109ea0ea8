"""Compiled kernels are cached on disk (GPU only: the simulator compiles nothing), in a directory named by a
digest of kernels_numba's sources, so a second process loads every kernel the first one compiled."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernels_numba
from kernels_numba import common
from kernels_numba.common import SIMULATOR, kernel_cache_dir

PACKAGE = Path(kernels_numba.__file__).parent
gpu_only = pytest.mark.skipif(SIMULATOR, reason="the simulator compiles nothing, so there is nothing to cache")


def test_the_cache_dir_is_named_by_every_source_of_the_package(tmp_path):
    package = shutil.copytree(PACKAGE, tmp_path / "kernels_numba", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    path = kernel_cache_dir(env, package)
    assert path.parent == tmp_path / "cache" / "tinyvllm" / "numba" and len(path.name) == 16
    assert kernel_cache_dir(env, package) == path
    # a change to a device function's file must miss: numba would only check the file of the kernel itself
    bf16 = package / "bf16.py"
    bf16.write_text(bf16.read_text() + "\n# changed\n")
    assert kernel_cache_dir(env, package) != path
    assert kernel_cache_dir({}, package).parent == Path.home() / ".cache" / "tinyvllm" / "numba"


def test_a_users_numba_cache_dir_wins_but_not_one_a_tinyvllm_parent_set(tmp_path):
    mine = str(tmp_path / "mine")
    assert kernel_cache_dir({"NUMBA_CACHE_DIR": mine}, PACKAGE) == Path(mine)
    inherited = {"NUMBA_CACHE_DIR": mine, "TINYVLLM_KERNEL_CACHE_DIR": mine, "XDG_CACHE_HOME": str(tmp_path)}
    assert kernel_cache_dir(inherited, PACKAGE).parent == tmp_path / "tinyvllm" / "numba"


@gpu_only
def test_kernels_are_cached_and_device_functions_are_not():
    from kernels_numba.bf16 import bf16_to_f32, bf16_to_f32_kernel
    assert common.CACHE_KERNELS and bf16_to_f32_kernel in common._KERNELS
    assert type(bf16_to_f32_kernel._cache).__name__ == "CUDACache"
    assert Path(bf16_to_f32_kernel.stats.cache_path).is_relative_to(kernel_cache_dir())
    assert type(bf16_to_f32._cache).__name__ == "NullCache" and bf16_to_f32 not in common._KERNELS


# The engine's kernels, and the tensor-core GEMM, whose kernel calls mma.py's @intrinsic inline-PTX functions.
GENERATE = """
import json
import numpy as np
from kernels_numba.common import cuda, kernel_cache_stats
from kernels_numba.gemm_tc import gemm_tc
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
engine = LLMEngine(None, EngineConfig(max_model_len=64), log=lambda message: None)
out = engine.generate(["The sun rose", "Hi"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 64)).astype(np.float32)
w = rng.integers(0x3C00, 0x3F00, (64, 64)).astype(np.uint16)
y = gemm_tc(cuda.to_device(x), cuda.to_device(w)).copy_to_host()
print(json.dumps({"tokens": [o.token_ids for o in out], "gemm_tc": y.sum().item(), "stats": kernel_cache_stats()}))
"""


@gpu_only
def test_a_second_process_loads_every_kernel_the_first_compiled(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("NUMBA_CACHE_DIR", None)  # this test's cache root, not the one this process uses
    env.pop("TINYVLLM_KERNEL_CACHE_DIR", None)

    def run():
        proc = subprocess.run([sys.executable, "-c", GENERATE], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])
    first, second = run(), run()
    compiled, loaded = first["stats"]
    assert compiled > 10 and loaded == 0
    assert second["stats"] == [0, compiled], "every kernel the first process compiled is loaded, none compiled"
    assert second["tokens"] == first["tokens"] and second["gemm_tc"] == first["gemm_tc"]
    assert list((tmp_path / "tinyvllm" / "numba").iterdir())


def test_every_kernel_is_made_by_the_common_jit():
    # common.jit caches kernels on a GPU and adapts options to the simulator; a bare cuda.jit would do neither
    offenders = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted(PACKAGE.rglob("*.py")) if path.name != "common.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if "cuda.jit(" in line or "@cuda.jit" in line]
    assert not offenders, f"use kernels_numba.common.jit: {offenders}"


CLOSURE_DIGESTS = """
import json
from kernels_numba.closure_key import closure_digest
from kernels_numba.gemm_tc import TileShape, _gemm_tc_kernel
from kernels_numba.mma import cp_async_wait_group


def factory(tile, offset):
    wait = cp_async_wait_group(tile.stages - 2)   # an intrinsic (a numba dispatcher-like object on a GPU)

    def helper(a):
        def nested(b):   # a code object among helper's constants: its repr holds an address
            return b + offset
        return nested(a) + tile.block_k

    def kernel(x):
        wait()
        helper(x)
    return kernel


tiles = [TileShape(64, 128, 32, 2, 2, 3), TileShape(64, 64, 32, 2, 2, 4)]
digests = [closure_digest(factory(t, 0)) for t in tiles] + [closure_digest(factory(tiles[0], 1))]
for swiglu in (False, True):  # the SwiGLU epilogue's variant: a key of its own
    kernel = _gemm_tc_kernel(tiles[0], False, False, swiglu)
    digests.append(closure_digest(getattr(kernel, "py_func", None) or kernel.fn))
print(json.dumps(digests))
"""


def test_a_closure_kernels_cache_key_is_the_same_in_every_process_and_differs_by_its_values():
    """numba keys a closure kernel by its free variables' pickle, and a dispatcher pickles with a random uuid (each
    process compiled gemm_tc again); closure_key describes them by what they are made of."""
    def digests():
        proc = subprocess.run([sys.executable, "-c", CLOSURE_DIGESTS], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])
    first, second = digests(), digests()
    assert first == second
    assert len(set(first)) == len(first), "another tile, another captured value: another key"
