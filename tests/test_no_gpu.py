"""Without a usable CUDA GPU and without NUMBA_ENABLE_CUDASIM, tinyvllm picks numba's simulator with a one-line
notice; with NUMBA_ENABLE_CUDASIM=0 (a GPU asked for) it fails with one line that says how to run. Both in a
fresh process, as a user starts one. On a GPU machine CUDA_VISIBLE_DEVICES="" hides the devices."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(code_or_args, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), **env_changes)
    argv = [sys.executable, *(["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)


def test_no_gpu_picks_the_simulator_with_a_one_line_notice():
    p = run("import os, kernels_numba.common as c; print(c.SIMULATOR, os.environ['NUMBA_ENABLE_CUDASIM'])")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "True 1\n"
    notice = [line for line in p.stderr.splitlines() if line.startswith("tinyvllm: no CUDA GPU found (")]
    assert len(notice) == 1 and notice[0].endswith(
        "; running in numba's CUDA simulator (slow). Set NUMBA_ENABLE_CUDASIM=1 to silence this."), p.stderr
    assert "CudaSupportError" not in p.stderr


def test_an_explicit_choice_is_respected_and_a_missing_gpu_is_one_line():
    quiet = run("import kernels_numba.common as c; print(c.SIMULATOR)", NUMBA_ENABLE_CUDASIM="1")
    assert quiet.stdout == "True\n" and "no CUDA GPU" not in quiet.stderr
    asked = run(["-m", "tinyvllm.cli", "generate", "--prompt", "x", "--max-tokens", "1"], NUMBA_ENABLE_CUDASIM="0")
    assert asked.returncode == 1, asked.stderr
    last = asked.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no usable CUDA GPU (") and "set NUMBA_ENABLE_CUDASIM=1" in last, asked.stderr
    assert "Traceback" not in asked.stderr and "tinyvllm: no CUDA GPU found" not in asked.stderr
