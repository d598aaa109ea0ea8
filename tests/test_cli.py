"""The `tinyvllm` command: output on the demo model, and a one-line message (no traceback) for bad input."""

import pytest

from tinyvllm.cli import main

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

def test_generate_chat_wraps_the_prompt_in_the_template(capsys):
    code, out, err = run(capsys, "generate", "--chat", "--prompt", "Hi", "--max-tokens", "1")
    assert code == 0, err
    assert "(1 tokens" in out

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
    assert "error: prompt has" in out and "(1 tokens, length)" in out


def test_jsonl_requests_with_their_own_sampling_and_a_metrics_file(capsys, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"prompt": "The sun", "max_tokens": 1}\n'
                        '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0.5, "seed": 3}\n')
    metrics = tmp_path / "metrics.json"
    code, out, err = run(capsys, "generate", "--prompts-file", str(requests), "--metrics-json", str(metrics))
    assert code == 0, err
    assert "(1 tokens, length)" in out and "(2 tokens, length)" in out
    import json
    summary = json.loads(metrics.read_text())
    assert summary["num_completed"] == 2 and summary["total_output_tokens"] == 3
    assert len(summary["requests"]) == 2 and summary["steps"]


@pytest.mark.parametrize("line, message", [
    ("not json", "requests.jsonl:1: not JSON"),
    ('{"text": "x"}', 'expected an object with "prompt" or "messages"'),
    ('{"prompt": "x", "top_p": 0}', "request 0: top_p must be"),
    ('{"prompt": "x", "temprature": 1}', "unknown sampling fields"),
])
def test_bad_jsonl_lines_are_named(capsys, tmp_path, line, message):
    requests = tmp_path / "requests.jsonl"
    requests.write_text(line + "\n")
    code, out, err = run(capsys, "generate", "--prompts-file", str(requests))
    assert code == 1 and message in err and "Traceback" not in err


def test_use_generation_config_takes_the_models_settings(capsys):
    # The demo's generation_config.json samples (temperature 0.6, top_p 0.9); an explicit flag still wins.
    from tinyvllm import cli
    from tinyvllm.cli import _parser
    args = _parser().parse_args(["generate", "--prompt", "x", "--use-generation-config", "--top-p", "0.5"])
    params = cli._sampling_params(args, {}, "test")
    assert params.temperature == pytest.approx(0.6) and params.top_p == 0.5
