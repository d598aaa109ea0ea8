"""A first start that compiles in parallel: the kernels the CUDA-graph steps need, compiled in worker processes
before the graphs are captured, instead of one at a time as each bucket's recording pass first launches them.

    compile_graph_kernels(runner, log=print)   # then runner.capture_graphs() finds them compiled

1. Discover (kernels_numba.compile_ahead): a bucket's recording pass runs with launches that launch nothing,
   listing each (kernel, argument types) neither compiled nor in the disk cache. The largest prefill and decode
   buckets go first. When they miss nothing (a warm cache) that is all: whatever a smaller bucket might still miss
   compiles at its capture, one at a time. Otherwise the workers start at once and every bucket's discovery here
   overlaps their start (the interpreter, numba, a CUDA context).
2. The misses go to a file, pickled (a numba dispatcher pickles as its Python function, closure included, and
   its options; numba types pickle too). N workers (`python -m tinyvllm.runner.compile_workers FOLDER I SPAWNED`,
   N at most the CPU cores, MAX_WORKERS and what the GPU's free memory holds of CUDA contexts) read it and claim
   misses one at a time from a shared counter (a locked file) until none is left, so a worker done early takes more.
   A worker needs no model and no runner; its payloads come back in a file.
3. Install each payload whose identity matches (loaded here, saved to the disk cache for the next start).
A miss that does not pickle, and whatever a failed or late worker did not deliver, compiles at its first launch as
before: a worker costs nothing but time. GPU only; the simulator compiles nothing.
"""
from __future__ import annotations

import dataclasses
import fcntl
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
WORKER_BYTES = 1 << 30  # GPU memory a worker may take: its CUDA context and the compiler's
POLL_S = 0.01           # how often a started worker looks for the misses file


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
    """The kernels every CUDA-graph bucket of the runner launches (`largest_only`: the largest decode and prefill
    buckets') that are neither compiled nor in the disk cache, in the order capture_graphs would first launch them
    (no step is kept)."""
    with discovering() as misses, _recording_only():
        for graphs in (runner.decode_graphs, runner.prefill_graphs):
            if graphs is not None:
                for bucket in sorted(graphs.buckets, reverse=True)[:1 if largest_only else None]:
                    graphs._make(bucket)
    return misses


def worker_count(requested: int | None = None) -> int:
    """How many workers: `requested` (or the CPU cores), at most MAX_WORKERS and what half the GPU's free memory
    holds at WORKER_BYTES each."""
    from kernels_numba.common import cuda
    cores = min(MAX_WORKERS, requested if requested is not None else os.cpu_count() or 1)
    free, _ = cuda.current_context().get_memory_info()
    return max(0, min(cores, int(free * 0.5 // WORKER_BYTES)))


def compile_graph_kernels(runner, log=None, workers: int | None = None) -> int:
    """Compile what the runner's CUDA-graph buckets will launch, in parallel worker processes, and install it here.
    Returns how many kernels were installed (0: nothing to compile, or too little to be worth processes)."""
    from kernels_numba.common import SIMULATOR
    if SIMULATOR or (runner.decode_graphs is None and runner.prefill_graphs is None):
        return 0
    log = log or (lambda message: None)
    start = time.perf_counter()
    if not discover_graph_kernels(runner, largest_only=True):  # a warm cache
        return 0
    with tempfile.TemporaryDirectory(prefix="tinyvllm-compile-") as folder:
        pool = _WorkerPool(folder, worker_count(workers))  # starting while the discovery runs
        misses = discover_graph_kernels(runner)
        if pool.count < 2:
            pool.stop()
            return 0
        sent = pool.send(misses)
        log(f"compiling {sent} kernels in {pool.count} processes (a first start; the next one loads them; "
            f"found in {time.perf_counter() - start:.1f} s)")
        installed, phases, compiles = pool.collect(misses, WORKER_TIMEOUT_S - (time.perf_counter() - start), log)
    log(f"compiled {installed} of {len(misses)} kernels in {pool.count} processes in "
        f"{time.perf_counter() - start:.1f} s")
    if phases:
        log("  " + summarize(phases, compiles))
    return installed


class _WorkerPool:
    """`count` worker processes, started at once; their files in `folder`."""

    def __init__(self, folder: str, count: int):
        self.folder, self.count = Path(folder), count
        Path(folder, "next-miss").write_text("0")
        self.outs = [Path(folder, f"worker-{i}.pickle") for i in range(count)]
        self.logs = [open(Path(folder, f"worker-{i}.log"), "w") for i in range(count)]
        self.processes = [subprocess.Popen([sys.executable, "-m", "tinyvllm.runner.compile_workers", folder, str(i),
                                            repr(time.time())], stdout=self.logs[i], stderr=subprocess.STDOUT)
                          for i in range(count)]

    def send(self, misses: list[Miss]) -> int:
        """Hand the workers `misses` (those that pickle, at their indexes); returns how many."""
        jobs = {}
        for index, miss in enumerate(misses):
            try:
                jobs[index] = pickle.dumps((miss.kernel, miss.argtypes), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - such a kernel compiles at its first launch instead
                continue
        partial = self.folder / "misses.pickle.partial"
        partial.write_bytes(pickle.dumps((len(misses), jobs), protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(partial, self.folder / "misses.pickle")
        return len(jobs)

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
    """Seconds a worker spent: from its spawn to a CUDA context (the interpreter, imports, the context), then until
    the misses came, then compiling."""
    started: float
    waited: float
    compiled: float


def _short(qualified: str) -> str:
    """kernels_numba.gemm_wgmma.build.<locals>.kernel -> gemm_wgmma.build.kernel"""
    parts = [p for p in qualified.split(".") if p != "<locals>"]
    return ".".join(parts[1:] if parts[0] == "kernels_numba" else parts)


def summarize(phases: list[WorkerPhases], compiles: list[tuple[float, str]]) -> str:
    """One line: where the workers' time went (the slowest worker's phases) and the slowest compiles."""
    slowest = max(phases, key=lambda p: p.started + p.waited + p.compiled)
    top = ", ".join(f"{_short(name)} {seconds:.1f} s" for seconds, name in sorted(compiles, reverse=True)[:3])
    return (f"slowest worker: started {slowest.started:.1f} s, waited for the misses {slowest.waited:.1f} s, "
            f"compiled {slowest.compiled:.1f} s; all compiles {sum(s for s, _ in compiles):.1f} s, slowest: {top}")


def claim(counter_path: str) -> int:
    """The next unclaimed index of the shared counter file (each index is handed to one caller only)."""
    with open(counter_path, "r+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        index = int(counter.read())
        counter.seek(0)
        counter.write(str(index + 1))
        counter.truncate()
    return index


def worker(folder: str, index: int, spawned: float, timeout_s: float = WORKER_TIMEOUT_S) -> int:
    """Worker `index`: a CUDA context, then (once the parent wrote them) the misses it claims compiled; the payloads
    (each with its compile seconds) go to worker-INDEX.pickle after its WorkerPhases. `spawned`: the parent's
    time.time() at its start."""
    from kernels_numba.common import cuda
    cuda.current_context()
    ready = time.time()
    misses_path, deadline = Path(folder, "misses.pickle"), ready + timeout_s
    while not misses_path.exists():
        if time.time() > deadline:
            return 1
        time.sleep(POLL_S)
    received = time.time()
    count, jobs = pickle.loads(misses_path.read_bytes())
    results = []
    while (i := claim(str(Path(folder, "next-miss")))) < count:
        if i not in jobs:
            continue
        begun = time.time()
        miss = Miss(*pickle.loads(jobs[i]))
        results.append((i, identity(miss), compile_payload(miss), time.time() - begun))
    phases = WorkerPhases(ready - spawned, received - ready, time.time() - received)
    out = Path(folder, f"worker-{index}.pickle")
    partial = Path(str(out) + ".partial")
    partial.write_bytes(pickle.dumps((phases, results), protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(partial, out)
    return 0


if __name__ == "__main__":  # (through the module, not __main__: pickles name the module's classes)
    from tinyvllm.runner.compile_workers import worker as module_worker
    sys.exit(module_worker(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
