"""Chat templates: Meta's Llama 3.2 Instruct template and a renderer that behaves like transformers'.

A chat template is a jinja program that turns a list of {"role", "content"} messages into the exact
prompt text the model was trained on. We render it the way transformers' apply_chat_template does
(sandboxed jinja, trim_blocks + lstrip_blocks, loopcontrols, raise_exception / strftime_now globals and a
non-HTML-escaping tojson), so the same template gives byte-identical text here and in transformers.
"""
import functools
import json
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinyvllm.errors import TinyVLLMError

# The chat_template from meta-llama/Llama-3.2-1B-Instruct's tokenizer_config.json, verbatim.
# Raw string: the "\n" inside the jinja string literals are jinja escapes, not Python ones.
LLAMA32_CHAT_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""


def render_chat_template(template: str, messages, *, add_generation_prompt: bool = True, bos_token: str,
                         eos_token: str, **extra) -> str:
    """The prompt text `template` makes of `messages`; `extra` reaches the template as variables
    (e.g. date_string="26 Jul 2024" pins the Llama 3.2 system block's date)."""
    check_messages(messages)
    try:
        compiled = _compile(template)
        return compiled.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except (jinja2.TemplateError, TypeError) as e:  # TypeError: e.g. the template adds a str to a non-str
        raise TinyVLLMError(f"chat template failed: {type(e).__name__}: {e}") from e


def check_messages(messages) -> None:
    """A chat is a non-empty list of {"role": str, "content": str} dicts (tool results and tool calls, which
    the Llama template renders as JSON, may carry other content)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TinyVLLMError(f"chat messages must be a non-empty list of {{'role', 'content'}} dicts, "
                            f"got {type(messages).__name__} {messages!r:.80}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TinyVLLMError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r:.80}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise TinyVLLMError(f"chat message {i} needs a 'role' string, got {message!r:.80}")
        content_may_be_data = role in ("tool", "ipython") or "tool_calls" in message
        if "content" not in message and "tool_calls" not in message:
            raise TinyVLLMError(f"chat message {i} ({role}) has no 'content'")
        if not isinstance(message.get("content"), str) and not content_may_be_data:
            raise TinyVLLMError(f"chat message {i} ({role}) content must be a string, "
                                f"got {type(message.get('content')).__name__}")


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson HTML-escapes <, >, & and ' — transformers replaces it with plain json.dumps, so do we.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
