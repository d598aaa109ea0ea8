"""scripts/gpu.py, the one entry point for the GPU checks: its help and every step's wiring, without a GPU.

`--dry-run` prints each command a subcommand would run; every script and test file a command names must exist,
so a renamed or moved one shows here rather than on the GPU.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ("check", "compare", "bench", "suite", "profile")


def gpu_py(*args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_every_subcommand():
    text = gpu_py("--help")
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s+{name}\s+\S", text, re.M), f"{name} has no one-line description:\n{text}"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(name):
    assert "usage: gpu.py " + name in gpu_py(name, "--help")


def dry_run_targets(name: str) -> list[str]:
    """The choices a subcommand's first positional takes, read from its help."""
    text = gpu_py(name, "--help")
    match = re.search(r"\{([a-z0-9,-]+)\}", text)
    return match.group(1).split(",") if match else [""]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_dry_run_names_existing_scripts(name, tmp_path):
    for target in dry_run_targets(name):
        args = [name] + ([target] if target else [])
        if name in ("compare", "bench") and target in ("gguf", "eval"):
            args += ["--model", str(tmp_path / "model.gguf")]
        text = gpu_py(*args, "--dry-run", "--out", str(tmp_path))
        assert text.strip(), args
        for path in re.findall(r"(?:scripts|tests)/[\w/]+\.(?:py|sh)", text):
            assert (ROOT / path).is_file(), f"{args}: {path} does not exist"
