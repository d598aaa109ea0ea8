"""What `generate` shows while it runs: a progress bar on stderr, and `--stream`'s text as it comes.

Both are fed every RequestOutput the engine streams (LLMEngine.generate's `on_output`).
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from tinyvllm.cli.formatting import count
from tinyvllm.progress_timing import Ticker, format_eta

BAR_WIDTH = 24


class ProgressBar:
    """One status line: requests done, tokens, tok/s, elapsed, time left. On a terminal it is redrawn in place (at
    most 10 times a second); elsewhere (a log file) a new line is written every `log_every` seconds once the run has
    taken that long, so short runs stay quiet. A Ticker thread draws too, so the line keeps coming while one engine
    step runs for long (a prefill in the simulator); close() stops it. The bar counts tokens against each request's
    max_tokens, a finished request counting in full, so it ends at 100 % even when requests stop early.
    `estimate_s` (the simulator's up-front estimate) shapes the time left until tokens come."""

    def __init__(self, budgets: dict[str, int], out=None, log_every: float = 5.0, clock=time.perf_counter,
                 estimate_s: float | None = None, final_line: bool = True, ticking: bool = True):
        self.budgets = budgets                       # request id -> max_tokens
        self.done_tokens = dict.fromkeys(budgets, 0)
        self.finished: set[str] = set()
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.interval = 0.1 if self.tty else log_every
        self.clock = clock
        self.estimate_s = estimate_s
        self.final_line = final_line                 # close() writes the final state even if no line came before
        self.start = clock()
        self.last_drawn = None
        self.last_progress = None
        self.lock = threading.Lock()
        self.ticker = Ticker(max(self.interval, 1.0) if self.tty else self.interval, self._tick)
        if ticking:
            self.ticker.start()

    def update(self, output) -> None:
        if output.request_id not in self.budgets:
            return
        with self.lock:
            self.done_tokens[output.request_id] = len(output.token_ids)
            if output.finished:
                self.finished.add(output.request_id)
            self._draw_if_due(self.clock())

    def close(self) -> None:
        """The final state (unless that line is already the last one written, or no line was due yet)."""
        self.ticker.stop()
        with self.lock:
            now = self.clock()
            if self.last_drawn is None and not self.final_line:
                return
            if self.tty or self._progress() != self.last_progress:
                self._draw(now)
            if self.tty:
                self.out.write("\n")
                self.out.flush()

    def _tick(self) -> None:
        with self.lock:
            self._draw_if_due(self.clock())

    def _draw_if_due(self, now: float) -> None:
        if self.last_drawn is None:  # a terminal shows the bar at once, a log once the run has taken an interval
            due = self.tty or now - self.start >= self.interval
        else:
            due = now - self.last_drawn >= self.interval
        if due:
            self._draw(now)

    def _progress(self) -> tuple[float, int, int]:
        """(fraction done, requests finished, tokens generated)."""
        total = sum(self.budgets.values())
        counted = sum(self.budgets[r] if r in self.finished else min(n, self.budgets[r])
                      for r, n in self.done_tokens.items())
        return counted / total if total else 1.0, len(self.finished), sum(self.done_tokens.values())

    def line(self, now: float) -> str:
        fraction, finished, tokens = self._progress()
        filled = round(fraction * BAR_WIDTH)
        elapsed = now - self.start
        rate = f"{tokens / elapsed:.1f} tok/s" if elapsed > 0 else "- tok/s"
        return (f"generating [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * fraction:3.0f}% · "
                f"{finished}/{len(self.budgets)} requests · {tokens} tokens · {rate} · {elapsed:.0f} s · "
                f"{format_eta(elapsed, fraction, self.estimate_s)}")

    def _draw(self, now: float) -> None:
        self.last_drawn, self.last_progress = now, self._progress()
        if self.tty:
            self.out.write("\r" + self.line(now) + "\x1b[K")
        else:
            self.out.write(self.line(now) + "\n")
        self.out.flush()


@dataclass
class _Streamed:
    header: str                     # "[0] 'The sun'"
    holdback: int                   # characters kept back while running: a stop string may still cut them
    printed: int = 0                # characters of the text printed so far
    text: str = ""
    output: object = None           # the latest RequestOutput
    header_printed: bool = False
    done: bool = False


@dataclass
class OrderedStream:
    """`--stream`: each request's text printed as it comes, requests in prompt order. The first request is
    printed live; the others compute alongside, and each is printed (what it has so far at once, then live)
    when all requests before it have finished. A request's output is text, not repr, between its header
    line and a closing line with its token count and finish reason.

    While a request runs, the end of its text is held back when it could still change: an incomplete UTF-8
    character (decoded as U+FFFD), and up to the longest stop string minus one character (the engine cuts
    a stop string and what follows it out of the text when the string completes)."""
    out: object = None
    order: list[str] = field(default_factory=list)          # request ids in prompt order
    streams: dict[str, _Streamed] = field(default_factory=dict)
    cursor: int = 0

    def add(self, request_id: str, header: str, stop: tuple[str, ...] = ()) -> None:
        self.order.append(request_id)
        self.streams[request_id] = _Streamed(header, max((len(s) for s in stop), default=1) - 1)

    def update(self, output) -> None:
        s = self.streams.get(output.request_id)
        if s is None:
            return
        s.output, s.done = output, output.finished
        s.text = output.text
        self._flush()

    def _flush(self) -> None:
        out = self.out or sys.stdout
        while self.cursor < len(self.order):
            s = self.streams[self.order[self.cursor]]
            if not s.header_printed:
                out.write(s.header + "\n")
                s.header_printed = True
            if s.output is None:
                break
            if s.done:
                end = len(s.text)
            else:
                end = len(s.text.rstrip("\ufffd")) - s.holdback
            if end > s.printed:
                out.write(s.text[s.printed:end])
                s.printed = end
            if not s.done:
                break
            o = s.output
            if o.error:
                out.write(("\n" if s.printed else "") + f"    error: {o.error}\n")
            else:
                out.write(("\n" if s.printed else "") + f"    ({count(len(o.token_ids), 'token')}, {o.finish_reason})\n")
            self.cursor += 1
        out.flush()
