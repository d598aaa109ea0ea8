"""What `generate` is asked to run: prompts from --prompt flags and a prompts file, each checked on its own.

A prompts file is plain text (one prompt per non-blank line) or JSONL, one object per non-blank line:

    {"prompt": "text"}   or   {"prompt": [token ids]}   or   {"messages": [{"role": ..., "content": ...}, ...]}

optionally with SamplingParams fields of its own ("max_tokens": 8, "temperature": 0.7, ...). A file is JSONL
when its name ends in .jsonl; `-` reads stdin, which is JSONL when its first non-blank line starts with "{"
(`--prompts-format` says it outright). A bad line becomes a PromptSpec with `error` set ("FILE:LINE: field
...: what is wrong"); the others are unaffected.
"""
from __future__ import annotations

import difflib
import json
import numbers
import sys
from dataclasses import dataclass, field

from tinyvllm.errors import TinyVLLMError
from tinyvllm.engine.sampling_params import SamplingParams

STDIN = "-"
FORMATS = ("auto", "text", "jsonl")
PROMPT_FIELDS = ("prompt", "messages")


@dataclass
class PromptSpec:
    source: str                             # where it came from: "--prompt 1", "requests.jsonl:3"
    prompt: str | list[int] | list[dict] | None
    overrides: dict = field(default_factory=dict)   # the line's own sampling fields
    error: str | None = None                # "requests.jsonl:3: ...": this one does not run
    params: object = None                   # its SamplingParams, once checked against the flags
    request_id: str | None = None           # once queued in an engine


def sampling_fields() -> tuple[str, ...]:
    return tuple(SamplingParams.__dataclass_fields__)


def read_prompt_specs(prompts: list[str], path: str | None, fmt: str = "auto") -> list[PromptSpec]:
    """--prompt flags first, then the file's lines, in order."""
    specs = [PromptSpec(f"--prompt {i + 1}", p) for i, p in enumerate(prompts)]
    if path is not None:
        specs += read_prompts_file(path, fmt)
    if not specs:
        raise TinyVLLMError("no prompt given: use --prompt TEXT (repeatable) or --prompts-file FILE (- for stdin)")
    return specs


def read_prompts_file(path: str, fmt: str = "auto") -> list[PromptSpec]:
    assert fmt in FORMATS
    name = "<stdin>" if path == STDIN else path
    try:
        if path == STDIN:
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise TinyVLLMError(f"cannot read prompts file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise TinyVLLMError(f"cannot read prompts file {name}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if fmt == "auto":
        if path == STDIN:
            fmt = "jsonl" if lines and lines[0][1].lstrip().startswith("{") else "text"
        else:
            fmt = "jsonl" if path.endswith(".jsonl") else "text"
    if fmt == "text":
        return [PromptSpec(f"{name}:{n}", line) for n, line in lines]
    return [parse_jsonl_line(line, f"{name}:{n}") for n, line in lines]


def parse_jsonl_line(line: str, where: str) -> PromptSpec:
    """One JSONL request; any problem becomes the spec's one-line error naming `where` and the field."""
    try:
        return PromptSpec(where, *_parse(line))
    except ValueError as e:
        return PromptSpec(where, None, error=f"{where}: {e}")


def _parse(line: str) -> tuple[object, dict]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(item, dict):
        raise ValueError(f'expected an object with "prompt" or "messages", got {_json_type(item)}')
    allowed = PROMPT_FIELDS + sampling_fields()
    unknown = [k for k in item if k not in allowed]
    if unknown:  # first: {"promt": ...} is better answered with "did you mean" than with "no prompt"
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f'did you mean "{close[0]}"? ' if close else ""
        raise ValueError(f'unknown field {json.dumps(unknown[0])} ({hint}allowed: {", ".join(allowed)})')
    given = [k for k in PROMPT_FIELDS if k in item]
    if len(given) != 1:
        raise ValueError('expected exactly one of "prompt" or "messages"' + (", got both" if given else ""))
    overrides = {k: v for k, v in item.items() if k not in PROMPT_FIELDS}
    if "prompt" in item:
        return _check_prompt(item["prompt"]), overrides
    return _check_messages(item["messages"]), overrides


def _check_prompt(prompt) -> str | list[int]:
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt:
        bad = next((i for i, t in enumerate(prompt) if not _is_token_id(t)), None)
        if bad is None:
            return prompt
        raise ValueError(f'field "prompt[{bad}]" must be a token id (an integer >= 0), got {_json_type(prompt[bad])}')
    raise ValueError(f'field "prompt" must be a non-empty string or list of token ids, got {_json_type(prompt)}')


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'field "messages" must be a non-empty list of {{"role": ..., "content": ...}} objects, '
                         f"got {_json_type(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f'field "messages[{i}]" must be an object with "role" and "content", got {_json_type(m)}')
        for key in ("role", "content"):
            if not isinstance(m.get(key), str) or (key == "role" and not m[key]):
                got = "nothing" if key not in m else _json_type(m[key])
                raise ValueError(f'field "messages[{i}].{key}" must be a {"non-empty " if key == "role" else ""}'
                                 f"string, got {got}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise ValueError(f'field "messages[{i}]" has unknown key {json.dumps(extra[0])} (allowed: role, content)')
    return messages


def _is_token_id(t) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0


def _json_type(value) -> str:
    """A JSON value as a reader would name it: null, true, 123, "text", a list, an object."""
    if value is None or isinstance(value, (bool, numbers.Number)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 20 else value[:20] + "...")
    if isinstance(value, (list, dict)):
        return ("an empty " if not value else "a" + ("n " if isinstance(value, dict) else " ")) + (
            "object" if isinstance(value, dict) else "list")
    return type(value).__name__
