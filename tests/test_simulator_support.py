"""kernels_numba.common's fixes to numba's CUDA simulator."""
import threading
import time

import numpy as np
import pytest

from kernels_numba.common import SIMULATOR


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's shared memory only")
def test_threads_of_a_block_always_get_the_same_shared_array(monkeypatch):
    """Make the allocation slow, so every thread arrives while the first is still allocating: unlocked,
    each would build its own array; locked, all get the first one."""
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    shared = FakeCUDAShared(dynshared_size=0)
    real_empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.01)
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(np, "empty", slow_empty)

    arrays = []
    start = threading.Barrier(8)

    def thread():
        start.wait()
        arrays.append(shared.array(16, np.float32))  # one source line: one array for the block
    threads = [threading.Thread(target=thread) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(arrays) == 8 and all(a is arrays[0] for a in arrays)
