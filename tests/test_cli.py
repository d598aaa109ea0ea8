"""The `tinyvllm` command: output on the demo model, and a one-line message (no traceback) for bad input."""

import argparse
import io
import json

import pytest

from tinyvllm.cli import COMMANDS, build_parser, main, parse_args

def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err

def test_generate_prints_each_prompt_and_its_continuation(capsys):
    code, out, err = run(capsys, "generate", "--prompt", "The sun", "--prompt", "Hi", "--max-tokens", "2",
                         "--max-model-len", "16")
    assert code == 0, err
    assert "[0] 'The sun'" in out and "[1] 'Hi'" in out and out.count("(2 tokens, length)") == 2
    assert "TTFT" in err or "ttft" in err.lower()

def test_generate_chat_wraps_the_prompt_in_the_template(capsys, tmp_path):
    metrics = tmp_path / "metrics.json"
    code, out, err = run(capsys, "generate", "--chat", "--system", "Be brief.", "--prompt", "Hi", "--max-tokens", "1",
                         "--metrics-json", str(metrics))
    assert code == 0, err
    assert "[0] 'Hi'" in out and "(1 token," in out
    prompt = json.loads(metrics.read_text())["requests"][0]["prompt"]   # what the engine ran, as text
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert "Be brief.<|eot_id|>" in prompt and prompt.endswith(
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")

@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--model", "/nonexistent"], "model directory not found: /nonexistent"),
    (["generate"], "no prompt given"),
    (["generate", "--prompt", "x", "--max-tokens", "0"], "max_tokens must be an integer >= 1"),
    (["generate", "--prompt", "x", "--prompts-file", "/nonexistent.txt"], "cannot read prompts file"),
    (["generate", "--prompt", "x", "--max-model-len", "1"], "max_model_len must be >= 2"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "temperature"),
    (["generate", "--prompt", "x", "--top-p", "1.5"], "top_p"),
    (["check-goldens", "--goldens", "/nonexistent.npz"], "golden file not found"),
])
def test_bad_input_gets_one_clear_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 1
    assert err.startswith("error: ") and message in err and "Traceback" not in err

def test_a_broken_model_dir_names_the_file(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    code, out, err = run(capsys, "generate", "--prompt", "x", "--model", str(tmp_path))
    assert code == 1 and "config.json" in err and "Traceback" not in err

def test_a_prompt_longer_than_the_context_is_reported_and_the_rest_run(capsys):
    code, out, err = run(capsys, "generate", "--prompt", "The sun rose over the town", "--prompt", "Hi",
                         "--max-tokens", "1", "--max-model-len", "4")
    assert code == 1
    assert "error: prompt has" in out and "(1 token, length)" in out


def test_jsonl_requests_with_their_own_sampling_and_a_metrics_file(capsys, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"prompt": "The sun", "max_tokens": 1}\n'
                        '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0.5, "seed": 3}\n')
    metrics = tmp_path / "metrics.json"
    code, out, err = run(capsys, "generate", "--prompts-file", str(requests), "--metrics-json", str(metrics))
    assert code == 0, err
    assert "(1 token, length)" in out and "(2 tokens, length)" in out
    import json
    summary = json.loads(metrics.read_text())
    assert summary["num_completed"] == 2 and summary["total_output_tokens"] == 3
    assert len(summary["requests"]) == 2 and summary["steps"]


@pytest.mark.parametrize("line, message", [
    ("not json", "not JSON (Expecting value at column 1)"),
    ('{"text": "x"}', 'unknown field "text"'),
    ('{"max_tokens": 3}', 'expected exactly one of "prompt" or "messages"'),
    ('["x"]', 'expected an object with "prompt" or "messages", got a list'),
    ('{"prompt": "x", "messages": []}', 'expected exactly one of "prompt" or "messages", got both'),
    ('{"prompt": ""}', 'field "prompt" must be a non-empty string or list of token ids, got ""'),
    ('{"prompt": null}', 'field "prompt" must be a non-empty string or list of token ids, got null'),
    ('{"prompt": 123}', 'field "prompt" must be a non-empty string or list of token ids, got 123'),
    ('{"prompt": [1, true]}', 'field "prompt[1]" must be a token id (an integer >= 0), got true'),
    ('{"messages": "hello"}', 'field "messages" must be a non-empty list of {"role": ..., "content": ...} '
                              'objects, got "hello"'),
    ('{"messages": ["hello"]}', 'field "messages[0]" must be an object with "role" and "content", got "hello"'),
    ('{"messages": [{"role": "user"}]}', 'field "messages[0].content" must be a string, got nothing'),
    ('{"messages": [{"role": "user", "content": "x", "nme": 1}]}', 'field "messages[0]" has unknown key "nme"'),
    ('{"prompt": "x", "temprature": 1}', 'unknown field "temprature" (did you mean "temperature"?'),
    ('{"prompt": "x", "top_p": 0}', "top_p must be a number in (0, 1], got 0"),
    ('{"prompt": "x", "max_tokens": "8"}', "max_tokens must be an integer >= 1, got '8'"),
])
def test_each_bad_jsonl_line_gets_one_line_naming_file_line_and_field(capsys, tmp_path, line, message):
    requests = tmp_path / "requests.jsonl"
    requests.write_text('\n' + line + "\n")   # a blank first line still counts: this is line 2
    code, out, err = run(capsys, "generate", "--prompts-file", str(requests))
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"error: {requests}:2: {message}"), err
    assert "loading" not in err, "no valid request: the model is never loaded"


def test_stdin_jsonl_bad_lines_are_reported_before_the_model_loads_and_the_rest_run(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("sys.stdin", io.StringIO(
        '{"prompt": "The sun", "max_tokens": 1}\n'
        '{"prompt": null}\n'
        '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}\n'
        '{"prompt": "x", "temprature": 1}\n'))
    metrics = tmp_path / "metrics.json"
    code, out, err = run(capsys, "generate", "--prompts-file", "-", "--metrics-json", str(metrics), "--progress")
    assert code == 1
    bad = ['error: <stdin>:2: field "prompt" must be', 'error: <stdin>:4: unknown field "temprature"']
    assert all(b in err for b in bad) and max(err.index(b) for b in bad) < err.index("loading ")
    report = json.loads(metrics.read_text())
    texts = {r["source"]: r["text"] for r in report["requests"]}
    lines = out.splitlines()
    assert lines[0] == "[0] 'The sun'" and lines[1] == f"    -> {texts['<stdin>:1']!r}  (1 token, length)"
    assert lines[2].startswith("[1] " + bad[0]) and lines[3] == "[2] 'Hi'"
    assert lines[4] == f"    -> {texts['<stdin>:3']!r}  (2 tokens, length)" and lines[5].startswith("[3] " + bad[1])
    assert [(r["source"], r["output_tokens"], r["prompt"]) for r in report["requests"]][0] == ("<stdin>:1", 1, "The sun")
    assert [r["source"] for r in report["rejected"]] == ["<stdin>:2", "<stdin>:4"]
    assert report["ttft_ms"]["count"] == 2 and report["total_output_tokens"] == 3
    assert "generating [" in err and "100% · 2/2 requests · 3 tokens" in err   # --progress on a non-terminal


def test_stream_prints_each_output_in_prompt_order_as_text(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("sys.stdin", io.StringIO("The sun\n\nA dog\n"))   # stdin as plain text: one prompt a line
    metrics = tmp_path / "metrics.json"
    code, out, err = run(capsys, "generate", "--prompts-file", "-", "--stream", "--max-tokens", "3",
                         "--metrics-json", str(metrics), "--quiet-metrics")
    assert code == 0, err
    text = {r["source"]: r["text"] for r in json.loads(metrics.read_text())["requests"]}
    assert set(text) == {"<stdin>:1", "<stdin>:3"} and all(text.values())
    assert out == (f"[0] 'The sun'\n{text['<stdin>:1']}\n    (3 tokens, length)\n"
                   f"[1] 'A dog'\n{text['<stdin>:3']}\n    (3 tokens, length)\n")
    assert "generating [" not in err   # no progress bar unless asked for (stderr is not a terminal here)


def test_help_shows_defaults_and_every_flag_has_help(capsys):
    parser = build_parser(loaded=COMMANDS)
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [(name, a.option_strings) for name, p in subcommands.items() for a in p._actions
               if a.option_strings and not a.help]
    assert not missing, f"flags without help: {missing}"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())   # argparse wraps lines
    assert "new tokens per prompt (default: 32)" in out and "(1 = off) (default: 1.0)" in out
    assert "--min-tokens N ignore EOS and stop tokens until this many new tokens (default: 0)" in out
    assert "token budget per step (default: 512)" in out and "(default: None)" not in out


def test_a_command_loads_only_its_own_module():
    """`tinyvllm generate` parses without the server's or the debugger's packages (a fresh interpreter)."""
    import subprocess
    import sys
    code = ("import sys; from tinyvllm.cli import parse_args; parse_args(['generate', '--prompt', 'x']); "
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'textual', 'debugger', 'tinyvllm.serving') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_version_is_the_package_metadata_version(capsys):
    """The installed metadata's version; run from a source tree that is not installed (the GPU machine puts the
    checkout on PYTHONPATH), the package's own __version__."""
    from importlib.metadata import PackageNotFoundError, version
    import tinyvllm
    try:
        expected = version("tinyvllm")
    except PackageNotFoundError:
        expected = tinyvllm.__version__
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"tinyvllm {expected}\n"


@pytest.mark.parametrize("failure", ["stylesheet", "panel"])
def test_a_failure_inside_the_debugger_exits_non_zero_with_one_line(capsys, monkeypatch, failure):
    import textual.constants
    from debugger.app import DebuggerApp
    if failure == "stylesheet":
        monkeypatch.setattr(DebuggerApp, "CSS_PATH", "missing.tcss")
    else:
        def broken_mount(self):
            raise RuntimeError("a panel broke")
        monkeypatch.setattr(DebuggerApp, "on_mount", broken_mount)
        monkeypatch.setattr(textual.constants, "DRIVER", "textual.drivers.headless_driver:HeadlessDriver")
    code, out, err = run(capsys, "debug", "--no-goldens")
    assert code == 70 and "Traceback" not in err + out
    last = err.strip().splitlines()[-1]
    assert last.startswith("internal error: ") and ("missing.tcss" in last if failure == "stylesheet"
                                                     else "RuntimeError: a panel broke" in last)


def test_use_generation_config_takes_the_models_settings(capsys):
    # The demo's generation_config.json samples (temperature 0.6, top_p 0.9); an explicit flag still wins.
    from tinyvllm.cli import generate
    args = parse_args(["generate", "--prompt", "x", "--use-generation-config", "--top-p", "0.5"])
    params = generate._sampling_params(args, {}, "test")
    assert params.temperature == pytest.approx(0.6) and params.top_p == 0.5
