"""GPU time of a captured step and of each of its stages alone: the stages replayed one CUDA graph each, so a stage's
time is its kernels' alone (no launch overhead, no host work), and their sum against the whole graph's time shows
what the gaps between kernels cost. Used by scripts/profile_decode.py and scripts/profile_prefill.py. GPU only."""
from __future__ import annotations


def time_graph(graph, repeats: int) -> float:
    """Milliseconds one launch of a completed graph takes on the default stream (CUDA events, after one warm-up)."""
    from cuda.core import Stream
    from kernels_numba.common import cuda
    stream = Stream.from_handle(0)
    graph.launch(stream)
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(repeats):
        graph.launch(stream)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / repeats


def stage_times(stages, arena, repeats: int) -> dict[str, tuple[float, int, str]]:
    """Each stage of the generator `stages` (forward stages launching into `arena`'s buffers) captured as a graph of
    its own and timed: stage kind -> (milliseconds summed over its layers, how many, its kernel)."""
    from cuda.core import Device
    from kernels_numba.common import cuda, launching_into
    per_kind, done = {}, False
    while not done:
        builder = Device().create_graph_builder()
        builder.begin_building()
        with cuda.defer_cleanup(), launching_into(builder, arena):
            try:
                stage = next(stages)
            except StopIteration:
                done = True
        if done or not stage.launched:  # nothing was launched: no graph to time
            try:
                builder.end_building()
            except Exception:  # noqa: BLE001 (an empty capture)
                pass
            continue
        graph = builder.end_building().complete()
        kind = stage.name.split(".")[-1]
        ms, count, kernel = per_kind.get(kind, (0.0, 0, stage.kernel))
        per_kind[kind] = (ms + time_graph(graph, repeats), count + 1, kernel)
    return per_kind
