"""A first start that compiles in parallel: the kernels the CUDA-graph steps need, compiled in worker processes
before the graphs are captured, instead of one at a time as each bucket's recording pass first launches them.

    compile_graph_kernels(config, runner, log=print)   # then runner.capture_graphs() finds them compiled

1. Discover (kernels_numba.compile_ahead): every bucket's recording pass runs with launches that launch nothing,
   listing each (kernel, argument types) neither compiled nor in the disk cache. A warm cache lists none: done.
   The largest bucket goes first: when it misses anything (an empty cache), the workers start at once and the
   rest of the discovery here overlaps their start; otherwise they start after it, if anything missed.
2. Start N workers (`python -m tinyvllm.runner.compile_workers SPEC I OUT SPAWNED`), N at most the CPU cores, what
   the GPU's free memory holds of the model and (when known first) the misses. A worker reads no model file: the
   spec carries the model's config, RoPE frequencies and its weights' shapes and dtypes (uninitialised device
   arrays there: the kernels and tiles follow shapes, never values), and a small KV pool (its size changes no
   kernel). Each worker builds the same runner, discovers the same list, then claims misses one at a time from a
   shared counter (a locked file) until none is left, so a worker done early takes more; its payloads come back
   in a file.
3. Install each payload whose identity matches (loaded here, saved to the disk cache for the next start).
A worker that fails or times out costs nothing but time: what it did not deliver compiles at its first launch as
before. GPU only; the simulator compiles nothing.
"""
from __future__ import annotations

import dataclasses
import fcntl
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
    counter: str          # the file of the next unclaimed miss's index


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


def discover_graph_kernels(runner, largest_only: bool = False) -> list[Miss]:
    """The kernels every CUDA-graph bucket of the runner launches (`largest_only`: the largest prefill bucket's, else
    decode's) that are neither compiled nor in the disk cache, in the order capture_graphs would first launch them
    (no step is kept)."""
    with discovering() as misses, _recording_only():
        for graphs in (runner.prefill_graphs, runner.decode_graphs) if largest_only else (runner.decode_graphs,
                                                                                         runner.prefill_graphs):
            if graphs is not None:
                for bucket in sorted(graphs.buckets, reverse=True)[:1 if largest_only else None]:
                    graphs._make(bucket)
                if largest_only:
                    break
    return misses


def _device_bytes(weights) -> int:
    """Bytes of the weights' device arrays, each once (a tied lm_head is the embedding)."""
    sizes = {}
    _map_leaves(weights, _is_device_array, lambda array: sizes.setdefault(id(array), int(array.nbytes)))
    return sum(sizes.values())


def worker_count(misses: int, weight_bytes: int, requested: int | None = None) -> int:
    """How many workers: `requested` (or the CPU cores, at most MAX_WORKERS), no more than `misses`, nor than
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
    weight_bytes = _device_bytes(runner.weights)
    early = bool(discover_graph_kernels(runner, largest_only=True))  # an empty cache: start the workers now
    with tempfile.TemporaryDirectory(prefix="tinyvllm-compile-") as folder:
        pool = None
        if early:
            pool = _WorkerPool(config, runner, folder, worker_count(MAX_WORKERS, weight_bytes, workers))
        misses = discover_graph_kernels(runner)
        if pool is None:
            count = worker_count(len(misses), weight_bytes, workers)
            pool = _WorkerPool(config, runner, folder, count) if count >= 2 and misses else None
        if pool is None or pool.count < 2:
            if pool is not None:
                pool.stop()
            return 0
        log(f"compiling {len(misses)} kernels in {pool.count} processes (a first start; the next one loads them; "
            f"found in {time.perf_counter() - start:.1f} s)")
        installed, phases, compiles = pool.collect(misses, WORKER_TIMEOUT_S - (time.perf_counter() - start), log)
    log(f"compiled {installed} of {len(misses)} kernels in {pool.count} processes in "
        f"{time.perf_counter() - start:.1f} s")
    if phases:
        log("  " + summarize(phases, compiles))
    return installed


class _WorkerPool:
    """`count` worker processes started on the runner's spec, their files in `folder`."""

    def __init__(self, config, runner, folder: str, count: int):
        self.count = count
        blocks = math.ceil(config.max_model_len_for(runner.config.max_position_embeddings) / config.block_size) + 1
        counter = Path(folder, "next-miss")
        counter.write_text("0")
        spec = WorkerSpec(runner.config, weights_skeleton(runner.weights), runner.inv_freq.copy_to_host(),
                          dataclasses.replace(config, num_blocks=blocks), str(counter))
        spec_path = Path(folder, "spec.pickle")
        spec_path.write_bytes(pickle.dumps(spec))
        self.outs = [Path(folder, f"worker-{i}.pickle") for i in range(count)]
        self.logs = [open(Path(folder, f"worker-{i}.log"), "w") for i in range(count)]
        self.processes = [subprocess.Popen([sys.executable, "-m", "tinyvllm.runner.compile_workers", str(spec_path),
                                            str(i), str(out), repr(time.time())],
                                           stdout=self.logs[i], stderr=subprocess.STDOUT)
                          for i, out in enumerate(self.outs)]

    def stop(self) -> None:
        for process, log in zip(self.processes, self.logs):
            process.kill()
            process.wait()
            log.close()

    def collect(self, misses: list[Miss], timeout_s: float, log) -> tuple[int, list, list]:
        """Wait for every worker (within timeout_s in all) and install what each compiled: (how many installed,
        each worker's WorkerPhases, each compile's (seconds, kernel))."""
        deadline = time.perf_counter() + timeout_s
        installed, phases, compiles = 0, [], []
        for i, process in enumerate(self.processes):
            try:
                code = process.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                process.kill()
                code = "timed out"
            self.logs[i].close()
            if code != 0 or not self.outs[i].exists():
                tail = Path(self.logs[i].name).read_text(errors="replace").strip().splitlines()[-3:]
                log(f"compile worker {i} failed ({code}): {' | '.join(tail)}; what it had claimed compiles at its "
                    f"first launch")
                continue
            worker_phases, results = pickle.loads(self.outs[i].read_bytes())
            phases.append(worker_phases)
            for index, who, payload, seconds in results:
                if index < len(misses) and identity(misses[index]) == who:
                    install(misses[index], payload)
                    installed += 1
                    compiles.append((seconds, who[0]))
        return installed, phases, compiles


@dataclasses.dataclass(frozen=True)
class WorkerPhases:
    """Seconds a worker spent: from its spawn to worker() (the interpreter and imports), building its runner and
    discovering the misses, compiling its share."""
    started: float
    discovered: float
    compiled: float


def _short(qualified: str) -> str:
    """kernels_numba.gemm_wgmma.build.<locals>.kernel -> gemm_wgmma.build.kernel"""
    parts = [p for p in qualified.split(".") if p != "<locals>"]
    return ".".join(parts[1:] if parts[0] == "kernels_numba" else parts)


def summarize(phases: list[WorkerPhases], compiles: list[tuple[float, str]]) -> str:
    """One line: where the workers' time went (the slowest worker's phases) and the slowest compiles."""
    slowest = max(phases, key=lambda p: p.started + p.discovered + p.compiled)
    top = ", ".join(f"{_short(name)} {seconds:.1f} s" for seconds, name in sorted(compiles, reverse=True)[:3])
    return (f"slowest worker: started {slowest.started:.1f} s, runner and discovery {slowest.discovered:.1f} s, "
            f"compiles {slowest.compiled:.1f} s; all compiles {sum(s for s, _ in compiles):.1f} s, slowest: {top}")


def claim(counter_path: str) -> int:
    """The next unclaimed index of the shared counter file (each index is handed to one caller only)."""
    with open(counter_path, "r+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        index = int(counter.read())
        counter.seek(0)
        counter.write(str(index + 1))
        counter.truncate()
    return index


def worker(spec_path: str, index: int, out_path: str, spawned: float) -> int:
    """Worker `index`: build the spec's runner, discover the same misses, compile those it claims, write the payloads
    (each with its compile seconds) after its WorkerPhases; `spawned` is the parent's time.time() at its start."""
    entered = time.time()
    from tinyvllm.model.loader import LoadedModel
    from tinyvllm.runner.model_runner import ModelRunner
    spec: WorkerSpec = pickle.loads(Path(spec_path).read_bytes())
    model = LoadedModel(None, spec.model_config, None, None, empty_weights(spec.weights), spec.inv_freq)
    max_model_len = spec.config.max_model_len_for(spec.model_config.max_position_embeddings)
    runner = ModelRunner.for_engine(model, spec.config, max_model_len, log=lambda message: None)
    misses = discover_graph_kernels(runner)
    discovered = time.time()
    results = []
    while (i := claim(spec.counter)) < len(misses):
        begun = time.time()
        results.append((i, identity(misses[i]), compile_payload(misses[i]), time.time() - begun))
    phases = WorkerPhases(entered - spawned, discovered - entered, time.time() - discovered)
    partial = Path(out_path + ".partial")
    partial.write_bytes(pickle.dumps((phases, results), protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(partial, out_path)
    return 0


if __name__ == "__main__":  # (through the module, not __main__: the spec's classes must be the module's)
    from tinyvllm.runner.compile_workers import worker as module_worker
    sys.exit(module_worker(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
