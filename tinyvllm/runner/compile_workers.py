"""A first start that compiles in parallel: the kernels the CUDA-graph steps need, compiled in worker processes
before the graphs are captured, instead of one at a time as each bucket's recording pass first launches them.

    compile_graph_kernels(config, runner, log=print)   # then runner.capture_graphs() finds them compiled

1. Discover (kernels_numba.compile_ahead): every bucket's recording pass runs with launches that launch nothing,
   listing each (kernel, argument types) neither compiled nor in the disk cache. A warm cache lists none: done.
2. Start N workers (`python -m tinyvllm.runner.compile_workers SPEC I OUT`), N at most the misses, the CPU cores
   and what the GPU's free memory holds of the model. A worker reads no model file: the spec carries the model's
   config, RoPE frequencies and its weights' shapes and dtypes (uninitialised device arrays there: the kernels and
   tiles follow shapes, never values), and a small KV pool (its size changes no kernel). Worker i builds the same
   runner, discovers the same list and compiles misses i, i + N, ...; its payloads come back in a file.
3. Install each payload whose identity matches (loaded here, saved to the disk cache for the next start).
A worker that fails or times out costs nothing but time: what it did not deliver compiles at its first launch as
before. GPU only; the simulator compiles nothing.
"""
from __future__ import annotations

import dataclasses
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from kernels_numba.compile_ahead import Miss, compile_payload, discovering, identity, install

WORKER_TIMEOUT_S = 900
MAX_WORKERS = 16
WORKER_OVERHEAD_BYTES = 1 << 30  # a CUDA context, activations, a small KV pool


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    model_config: object  # the model's ModelConfig
    weights: object       # its DeviceWeights with every device array an ArraySpec
    inv_freq: object      # RoPE frequencies (numpy)
    config: object        # the engine's EngineConfig, with a small KV pool
    workers: int


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    shape: tuple
    dtype: str


def _is_device_array(value) -> bool:
    return hasattr(value, "copy_to_host") and hasattr(value, "shape")  # (the simulator's too)


def _map_leaves(value, is_leaf, convert):
    """`value` with each leaf (is_leaf) replaced by convert(leaf), through dataclasses, lists and tuples."""
    if is_leaf(value):
        return convert(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _map_leaves(getattr(value, f.name), is_leaf, convert)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, (list, tuple)):
        return type(value)(_map_leaves(v, is_leaf, convert) for v in value)
    return value


def weights_skeleton(weights):
    """The weights (DeviceWeights) with every device array replaced by its ArraySpec."""
    return _map_leaves(weights, _is_device_array, lambda array: ArraySpec(tuple(array.shape), array.dtype.str))


def empty_weights(skeleton):
    """A skeleton's device arrays allocated, uninitialised."""
    from kernels_numba.common import cuda
    return _map_leaves(skeleton, lambda value: isinstance(value, ArraySpec),
                       lambda spec: cuda.device_array(spec.shape, spec.dtype))


@contextmanager
def _recording_only():
    """CapturedStep records its pass (the eager launches) but captures no graph."""
    from tinyvllm.runner.cuda_graphs import CapturedStep
    original = CapturedStep._capture
    CapturedStep._capture = lambda step: None
    try:
        yield
    finally:
        CapturedStep._capture = original


def discover_graph_kernels(runner) -> list[Miss]:
    """The kernels every CUDA-graph bucket of the runner launches that are neither compiled nor in the disk cache,
    in the order capture_graphs would first launch them (no step is kept)."""
    with discovering() as misses, _recording_only():
        for graphs in (runner.decode_graphs, runner.prefill_graphs):
            if graphs is not None:
                for bucket in sorted(graphs.buckets, reverse=True):
                    graphs._make(bucket)
    return misses


def _device_bytes(weights) -> int:
    """Bytes of the weights' device arrays, each once (a tied lm_head is the embedding)."""
    sizes = {}
    _map_leaves(weights, _is_device_array, lambda array: sizes.setdefault(id(array), int(array.nbytes)))
    return sum(sizes.values())


def worker_count(misses: int, weight_bytes: int, requested: int | None = None) -> int:
    """How many workers: `requested` (or the CPU cores, at most MAX_WORKERS), no more than the misses, nor than
    half the GPU's free memory holds copies of the model."""
    from kernels_numba.common import cuda
    cores = requested if requested is not None else min(MAX_WORKERS, os.cpu_count() or 1)
    free, _ = cuda.current_context().get_memory_info()
    fit = int(free * 0.5 // (weight_bytes + WORKER_OVERHEAD_BYTES))
    return max(0, min(cores, misses, fit))


def compile_graph_kernels(config, runner, log=None, workers: int | None = None) -> int:
    """Compile what the runner's CUDA-graph buckets will launch, in parallel worker processes, and install it here.
    Returns how many kernels were installed (0: nothing to compile, or too little to be worth processes)."""
    from kernels_numba.common import SIMULATOR
    if SIMULATOR or (runner.decode_graphs is None and runner.prefill_graphs is None):
        return 0
    log = log or (lambda message: None)
    start = time.perf_counter()
    misses = discover_graph_kernels(runner)
    count = worker_count(len(misses), _device_bytes(runner.weights), workers)
    if count < 2:
        return 0
    blocks = math.ceil(config.max_model_len_for(runner.config.max_position_embeddings) / config.block_size) + 1
    spec = WorkerSpec(runner.config, weights_skeleton(runner.weights), runner.inv_freq.copy_to_host(),
                      dataclasses.replace(config, num_blocks=blocks), count)
    log(f"compiling {len(misses)} kernels in {count} processes (a first start; the next one loads them)")
    with tempfile.TemporaryDirectory(prefix="tinyvllm-compile-") as folder:
        spec_path = Path(folder, "spec.pickle")
        spec_path.write_bytes(pickle.dumps(spec))
        outs = [Path(folder, f"worker-{i}.pickle") for i in range(count)]
        logs = [open(Path(folder, f"worker-{i}.log"), "w") for i in range(count)]
        processes = [subprocess.Popen([sys.executable, "-m", "tinyvllm.runner.compile_workers", str(spec_path),
                                       str(i), str(out)], stdout=logs[i], stderr=subprocess.STDOUT)
                     for i, out in enumerate(outs)]
        installed = 0
        for i, process in enumerate(processes):
            try:
                code = process.wait(timeout=max(1.0, WORKER_TIMEOUT_S - (time.perf_counter() - start)))
            except subprocess.TimeoutExpired:
                process.kill()
                code = "timed out"
            logs[i].close()
            if code != 0 or not outs[i].exists():
                tail = Path(logs[i].name).read_text(errors="replace").strip().splitlines()[-3:]
                log(f"compile worker {i} failed ({code}): {' | '.join(tail)}; its kernels compile at first launch")
                continue
            for index, who, payload in pickle.loads(outs[i].read_bytes()):
                if index < len(misses) and identity(misses[index]) == who:
                    install(misses[index], payload)
                    installed += 1
    log(f"compiled {installed} of {len(misses)} kernels in {count} processes in {time.perf_counter() - start:.1f} s")
    return installed


def worker(spec_path: str, index: int, out_path: str) -> int:
    """Worker `index`: build the spec's runner, discover the same misses, compile its share, write the payloads."""
    from tinyvllm.model.loader import LoadedModel
    from tinyvllm.runner.model_runner import ModelRunner
    spec: WorkerSpec = pickle.loads(Path(spec_path).read_bytes())
    model = LoadedModel(None, spec.model_config, None, None, empty_weights(spec.weights), spec.inv_freq)
    max_model_len = spec.config.max_model_len_for(spec.model_config.max_position_embeddings)
    runner = ModelRunner.for_engine(model, spec.config, max_model_len, log=lambda message: None)
    misses = discover_graph_kernels(runner)
    results = [(i, identity(misses[i]), compile_payload(misses[i])) for i in range(index, len(misses), spec.workers)]
    partial = Path(out_path + ".partial")
    partial.write_bytes(pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(partial, out_path)
    return 0


if __name__ == "__main__":  # (through the module, not __main__: the spec's classes must be the module's)
    from tinyvllm.runner.compile_workers import worker as module_worker
    sys.exit(module_worker(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
