"""Progress without a terminal: generate's and eval's lines keep coming during a long step, their time left is
honest, and short runs stay quiet."""
import io
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tinyvllm.cli.live_output import ProgressBar
from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.progress import Progress
from tinyvllm.progress_timing import INTERVAL_ENV, eta_seconds, format_eta, log_interval


@dataclass
class Out:
    request_id: str
    token_ids: list
    finished: bool = False


def test_time_left_hands_over_from_the_estimate_to_the_measured_rate():
    assert eta_seconds(30, 0.0, estimate_s=100) == 70           # nothing done: what the estimate leaves
    assert eta_seconds(30, 0.0) is None                         # nothing done, no estimate (a GPU): unknown
    assert eta_seconds(130, 0.0, estimate_s=100) is None        # past the estimate with nothing done: unknown
    assert eta_seconds(30, 0.25) == 90                          # no estimate: the rate alone
    assert eta_seconds(30, 0.25, estimate_s=100) == 0.25 * 90 + 0.75 * 75  # the rate, trusted as the work gets done
    assert eta_seconds(130, 0.25, estimate_s=100) == 0.25 * 390 + 0.75 * 75  # past it: its share of the work left
    assert eta_seconds(30, 1.0, estimate_s=100) == 0
    assert [format_eta(30, 0.0, 100), format_eta(30, 0.25), format_eta(10, 0.0, 4000), format_eta(1, 0.0)] == [
        "eta ~1:10", "eta 1:30", "eta ~1:06:30", "eta ?"]


def test_the_interval_comes_from_the_environment(monkeypatch):
    assert log_interval(5.0) == 5.0
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    assert log_interval(5.0) == 0.5
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(TinyVLLMError, match=f"{INTERVAL_ENV} must be a number of seconds > 0, got 'soon'"):
        log_interval(5.0)


def test_a_burst_of_items_finishing_in_one_step_shows_no_extrapolated_first_item():
    """eval's 10 questions prefilled in one 13-minute step finish together: a line drawn after the first alone
    said 'eta 118:03' (9 more items at 787 s each). Lines are drawn by the ticker, after the burst."""
    log = io.StringIO()
    progress = Progress(10, "mmlu", stream=log, every_s=10.0, ticking=False)
    progress.start -= 787                                       # the step took 787 s
    for _ in range(10):
        progress.advance(1, 600)
    progress.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and " 10/10 " in lines[0] and lines[0].endswith("eta 0:00"), lines


def test_eval_progress_ticks_while_nothing_finishes():
    log = io.StringIO()
    progress = Progress(4, "mmlu", stream=log, every_s=0.05, estimate_s=590)
    time.sleep(0.5)                                              # one long engine step: no item finishes
    progress.close()
    lines = log.getvalue().splitlines()
    assert len(lines) >= 3 and all(" 0/4 " in line and "eta ~9:" in line for line in lines), lines


def test_the_bar_ticks_during_a_long_step_and_a_short_run_stays_quiet():
    log = io.StringIO()
    bar = ProgressBar({"0": 8}, out=log, log_every=0.05, estimate_s=290, final_line=False)
    time.sleep(0.5)                                              # a prefill: no token yet
    bar.update(Out("0", [1, 2, 3, 4, 5, 6, 7, 8], True))
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) >= 3 and "0/1 requests · 0 tokens" in lines[0] and "eta ~4:" in lines[0], lines
    assert "100% · 1/1 requests · 8 tokens" in lines[-1]
    quiet = io.StringIO()
    bar = ProgressBar({"0": 8}, out=quiet, log_every=60, final_line=False)
    bar.update(Out("0", [1, 2, 3, 4, 5, 6, 7, 8], True))
    bar.close()
    assert quiet.getvalue() == ""


def test_generate_writes_progress_lines_to_a_pipe_during_the_prefill():
    """`tinyvllm generate` as users run it into a log: stderr a pipe, lines every 0.5 s (the environment
    variable), the first while the prompt is still being prefilled (0 tokens). A quick demo run prints no
    simulator notice."""
    done = subprocess.run(
        [sys.executable, "-m", "tinyvllm.cli", "generate", "--prompt", "The sun rose over the town and the",
         "--max-tokens", "2", "--ignore-eos", "--quiet-metrics"], capture_output=True, text=True, timeout=300,
        env=os.environ | {"NUMBA_ENABLE_CUDASIM": "1", INTERVAL_ENV: "0.5"})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("generating [")]
    assert len(lines) >= 2, done.stderr
    assert "· 0/1 requests · 0 tokens ·" in lines[0] and "100% · 1/1 requests · 2 tokens" in lines[-1], lines
    assert "simulator:" not in done.stderr
