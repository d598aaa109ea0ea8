"""The chat template renderer against the Llama 3.2 Instruct prompt format written down in the reference."""
from datetime import datetime

import pytest

from tinyvllm.model.chat_template import LLAMA32_CHAT_TEMPLATE, render_chat_template
from tinyvllm.errors import TinyVLLMError

BOS, EOS = "<|begin_of_text|>", "<|eot_id|>"


def render(messages, template=LLAMA32_CHAT_TEMPLATE, **kwargs):
    return render_chat_template(template, messages, bos_token=BOS, eos_token=EOS, **kwargs)


def system_block(date, system=""):
    return ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            f"Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n{system}<|eot_id|>")


def test_system_and_user_match_the_published_format():
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    expected = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                "You are a helpful assistant.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render(messages, date_string="26 Jul 2024") == expected


def test_without_system_message_the_system_block_is_still_there():
    text = render([{"role": "user", "content": "Hi"}], date_string="26 Jul 2024")
    assert text == (system_block("26 Jul 2024")
                    + "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    + "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_today_comes_from_strftime_now_without_date_string():
    before = datetime.now().strftime("%d %b %Y")
    text = render([{"role": "user", "content": "Hi"}])
    after = datetime.now().strftime("%d %b %Y")  # the two differ only if the test straddles midnight
    assert text.startswith(system_block(before)) or text.startswith(system_block(after)), text[:160]


def test_multi_turn_contents_are_stripped_and_generation_prompt_optional():
    messages = [{"role": "user", "content": "  one \n"}, {"role": "assistant", "content": "\ntwo  "},
                {"role": "user", "content": "three"}]
    text = render(messages, add_generation_prompt=False, date_string="1 Jan 2025")
    assert text == (system_block("1 Jan 2025")
                    + "<|start_header_id|>user<|end_header_id|>\n\none<|eot_id|>"
                    + "<|start_header_id|>assistant<|end_header_id|>\n\ntwo<|eot_id|>"
                    + "<|start_header_id|>user<|end_header_id|>\n\nthree<|eot_id|>")


def test_tools_are_written_with_plain_json_into_the_first_user_message():
    tool = {"name": "lookup", "description": "Find <b> & 'c'", "parameters": {"q": "str"}}
    text = render([{"role": "user", "content": "Find it"}], tools=[tool], date_string="26 Jul 2024")
    assert "Environment: ipython\n" in text
    # transformers' tojson: json.dumps(indent=4), no HTML escaping of < > & '
    assert ('{\n    "name": "lookup",\n    "description": "Find <b> & \'c\'",\n    "parameters": {\n'
            '        "q": "str"\n    }\n}\n\nFind it<|eot_id|>') in text


def test_renderer_has_transformers_jinja_settings():
    # loopcontrols, and trim_blocks + lstrip_blocks: a block tag's own line leaves no whitespace behind
    template = "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}\n  {% if true %}\nA\n  {% endif %}\nB"
    assert render([{"role": "user", "content": "x"}], template=template) == "1A\nB"


@pytest.mark.parametrize("messages, complaint", [
    ("hello", "list"),
    ([], "non-empty"),
    (["hello"], "message 0"),
    ([{"content": "no role"}], "role"),
    ([{"role": "user"}], "content"),
    ([{"role": "user", "content": "ok"}, {"role": "user", "content": 7}], "message 1"),
])
def test_bad_messages_are_rejected(messages, complaint):
    with pytest.raises(TinyVLLMError, match=complaint):
        render(messages)


@pytest.mark.parametrize("template, messages, complaint", [
    ("{% if %}", [{"role": "user", "content": "x"}], "TemplateSyntaxError"),
    # the template's own raise_exception: tools need a user message to go into
    (LLAMA32_CHAT_TEMPLATE, [{"role": "system", "content": "s"}], "no first user message"),
    ("{% set xs = [] %}{{ xs.append(1) }}", [{"role": "user", "content": "x"}], "SecurityError"),
])
def test_template_errors_become_tinyvllm_errors(template, messages, complaint):
    with pytest.raises(TinyVLLMError, match=complaint):
        render(messages, template=template, tools=[{"name": "t"}])
