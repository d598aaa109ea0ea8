"""A progress bar on stderr: done / total, rate, prompt tokens per second and time left.

advance() only counts; a Ticker thread draws, on a terminal 5 times a second, otherwise (a log file, CI) every
`every_s` seconds (TINYVLLM_PROGRESS_EVERY_S overrides it), so logs stay short and a line still comes while
one engine step runs for minutes (the simulator). Drawing apart from counting also lets a burst of items
finishing in one engine step be counted whole before a line shows it: the time left of a line drawn after
the burst's first item alone would extrapolate one item's time (the whole step) to every other item.
Time left blends in the up-front estimate `estimate_s` where there is one (tinyvllm.progress_timing).
"""
from __future__ import annotations

import sys
import threading
import time

from tinyvllm.progress_timing import Ticker, format_eta, log_interval


class Progress:
    def __init__(self, total: int, label: str, stream=None, every_s: float = 10.0, width: int = 24,
                 estimate_s: float | None = None, ticking: bool = True):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every_s = 0.2 if self.tty else log_interval(every_s)
        self.estimate_s = estimate_s
        self.start = time.perf_counter()
        self.done = self.tokens = 0
        self.drawn = -1  # `done` at the last draw
        self.lock = threading.Lock()
        self.ticker = Ticker(self.every_s, self._tick)
        if ticking:
            self.ticker.start()

    def advance(self, items: int = 1, tokens: int = 0) -> None:
        with self.lock:
            self.done += items
            self.tokens += tokens

    def close(self) -> None:
        self.ticker.stop()
        with self.lock:
            if self.drawn != self.done:
                self._draw(time.perf_counter())
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()

    def _tick(self) -> None:
        with self.lock:
            self._draw(time.perf_counter())

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.perf_counter()) - self.start, 1e-9)
        filled = self.width * self.done // max(self.total, 1)
        rate = self.done / elapsed
        fraction = self.done / self.total if self.total else 1.0
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{rate:.1f} q/s {self.tokens / elapsed:.0f} prompt tok/s {elapsed:.0f} s "
                f"{format_eta(elapsed, fraction, self.estimate_s)}")

    def _draw(self, now: float) -> None:
        self.drawn = self.done
        self.stream.write(("\r" if self.tty else "") + self.line(now) + ("" if self.tty else "\n"))
        self.stream.flush()
