"""A first start compiles the CUDA-graph steps' kernels in worker processes (runner/compile_workers.py): each run
here is a fresh process with an empty kernel cache of its own, on the GPU (the simulator compiles nothing)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from types import SimpleNamespace

import pytest

from kernels_numba.common import SIMULATOR
from kernels_numba.compile_ahead import Miss, identity
from tinyvllm.engine.config import EngineConfig
from tinyvllm.errors import TinyVLLMError

ROOT = Path(__file__).resolve().parents[1]

START = """
import json, sys
from kernels_numba.common import kernel_cache_stats
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.runner.compile_workers import discover_graph_kernels
messages = []
engine = LLMEngine(None, EngineConfig(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64,
                                      compile_workers=int(sys.argv[1]), precision="fast"), log=messages.append)
engine.capture_graphs(messages.append)
compiled, loaded = kernel_cache_stats()
left = len(discover_graph_kernels(engine.runner))
out = engine.generate(["The sun rose", "Hi there"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
print("RESULT " + json.dumps({"tokens": [o.token_ids for o in out], "compiled": compiled, "left": left,
                              "messages": messages}))
"""


def _start(workers: int, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "TINYVLLM_KERNEL_CACHE_DIR")}
    done = subprocess.run([sys.executable, "-c", START, str(workers)], cwd=ROOT, capture_output=True, text=True,
                          env=env | {"XDG_CACHE_HOME": str(cache)}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _factory(n):
    def kernel(x):
        return x + n
    return kernel


def test_a_miss_is_known_in_any_process_by_its_function_closure_and_argument_types():
    """What a worker's payload is checked against before it is installed (the same in every process)."""
    one, two = SimpleNamespace(py_func=_factory(1)), SimpleNamespace(py_func=_factory(2))
    assert identity(Miss(one, ("int32",))) == identity(Miss(SimpleNamespace(py_func=_factory(1)), ("int32",)))
    assert identity(Miss(one, ("int32",))) != identity(Miss(two, ("int32",)))
    assert identity(Miss(one, ("int32",))) != identity(Miss(one, ("float32",)))
    assert identity(Miss(one, ("int32",)))[0].endswith("_factory.<locals>.kernel")


def test_compile_workers_must_not_be_negative():
    with pytest.raises(TinyVLLMError, match="compile_workers"):
        EngineConfig(compile_workers=-1)


@pytest.mark.skipif(SIMULATOR, reason="the simulator compiles nothing")
def test_workers_compile_what_the_graphs_need_and_the_tokens_stay_the_same(tmp_path):
    parallel = _start(4, tmp_path / "parallel")
    assert any("processes" in m and "compiled" in m for m in parallel["messages"]), parallel["messages"]
    # every graph kernel came from the workers: none compiled here, none left for a later launch
    assert parallel["left"] == 0
    serial = _start(0, tmp_path / "serial")
    assert not any("processes" in m for m in serial["messages"])
    assert serial["compiled"] > parallel["compiled"]
    assert parallel["tokens"] == serial["tokens"]
    warm = _start(4, tmp_path / "parallel")  # the workers' kernels were saved to the disk cache
    assert not any("processes" in m for m in warm["messages"]) and warm["tokens"] == serial["tokens"]


def _claim_many(counter: str, times: int) -> list[int]:
    from tinyvllm.runner.compile_workers import claim
    return [claim(counter) for _ in range(times)]


def test_workers_claim_each_miss_once(tmp_path):
    """The shared counter the workers take misses from: every index once, whoever asks, even all at once."""
    import multiprocessing
    counter = tmp_path / "next-miss"
    counter.write_text("0")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        claimed = pool.starmap(_claim_many, [(str(counter), 50)] * 4)
    assert sorted(i for got in claimed for i in got) == list(range(200))
    assert all(got == sorted(got) for got in claimed)  # each worker's claims only go up
