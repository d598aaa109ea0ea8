"""When progress lines are written, and the time left they show.

A progress line is drawn by a `Ticker` thread as well as by the work's own updates, so it keeps coming while
the main thread sits in one long engine step (a prefill of minutes in the simulator). Without a terminal a line
is written every `log_interval()` seconds (TINYVLLM_PROGRESS_EVERY_S overrides the command's default).

Time left (`eta_seconds`) blends the up-front estimate (tinyvllm.runtime_estimate, simulator only) with the
measured rate, trusting the rate as the work gets done. The rate alone misleads early: requests run
concurrently and finish in bursts, so the first finished item's time is nearly the whole run's, not one item's.
"""
from __future__ import annotations

import os
import threading

from tinyvllm.errors import TinyVLLMError

INTERVAL_ENV = "TINYVLLM_PROGRESS_EVERY_S"


def log_interval(default: float) -> float:
    """Seconds between progress lines written to a log (not a terminal)."""
    value = os.environ.get(INTERVAL_ENV)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise TinyVLLMError(f"{INTERVAL_ENV} must be a number of seconds > 0, got {value!r}")
    return seconds


def eta_seconds(elapsed: float, fraction: float, estimate_s: float | None = None) -> float | None:
    """Seconds left after `elapsed` with `fraction` of the work done; None when unknown (nothing done and no
    estimate, or nothing done past the estimate). With an estimate, its share of the work left (at least what is
    left of it) blended with the measured rate's, weighed by the fraction done."""
    if fraction >= 1.0:
        return 0.0
    measured = elapsed * (1.0 - fraction) / fraction if fraction > 0 else None
    if estimate_s is None:
        return measured
    if measured is None:
        return estimate_s - elapsed if estimate_s > elapsed else None
    planned = max(estimate_s - elapsed, estimate_s * (1.0 - fraction))
    return fraction * measured + (1.0 - fraction) * planned


def format_eta(elapsed: float, fraction: float, estimate_s: float | None = None) -> str:
    """'eta 12:05', 'eta ~1:02:30' (~: the up-front estimate has a share in it), 'eta ?'."""
    seconds = eta_seconds(elapsed, fraction, estimate_s)
    if seconds is None:
        return "eta ?"
    estimated = fraction < 1.0 and estimate_s is not None
    s = round(seconds)
    clock = f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    return f"eta {'~' if estimated else ''}{clock}"


class Ticker:
    """Calls `tick()` every `every_s` seconds on a daemon thread, from start() until stop()."""

    def __init__(self, every_s: float, tick):
        self.every_s, self.tick = every_s, tick
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-ticker", daemon=True)

    def start(self) -> "Ticker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            self.tick()
