"""A progress bar on stderr: done / total, rate, prompt tokens per second and time left.

On a terminal it redraws one line at most 5 times a second; otherwise (a log file, CI) it writes a line
every `every_s` seconds, so logs stay short.
"""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None, every_s: float = 10.0, width: int = 24):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every_s = 0.2 if self.tty else every_s
        self.start = self.last = time.perf_counter()
        self.done = self.tokens = 0
        self.drawn = -1  # `done` at the last draw

    def advance(self, items: int = 1, tokens: int = 0) -> None:
        self.done += items
        self.tokens += tokens
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            self._draw(now)

    def close(self) -> None:
        if self.drawn != self.done:
            self._draw(time.perf_counter())
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.perf_counter()) - self.start, 1e-9)
        filled = self.width * self.done // max(self.total, 1)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = f"{int(left // 60)}:{int(left % 60):02d}" if left != float("inf") else "?"
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{rate:.1f} q/s {self.tokens / elapsed:.0f} prompt tok/s eta {eta}")

    def _draw(self, now: float) -> None:
        self.drawn = self.done
        self.stream.write(("\r" if self.tty else "") + self.line(now) + ("" if self.tty else "\n"))
        self.stream.flush()
