"""`tinyvllm bench`: the benchmark's flags (tinyvllm/bench/config.py, and --replay's from serving/replay.py) and
its run (tinyvllm/bench/command.py)."""
from __future__ import annotations

from tinyvllm import bench
from tinyvllm.serving import replay

DESCRIPTION = bench.__doc__


def add_arguments(p) -> None:
    bench.add_arguments(p)
    replay.add_bench_arguments(p)


def run(args) -> int:
    return bench.run(args)
