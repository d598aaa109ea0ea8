"""The chat path end to end: the prompt ids the engine runs for a conversation are transformers' chat ids,
through LLM.generate, LLM.chat, `tinyvllm generate --chat` and a JSONL `messages` line (tests/hf_chat_ids.py).
One new token each, so each costs about its prefill: ~0.075 s of simulator time per prompt token not in the
prefix cache (the chat template's system block alone is ~35 ids)."""
import json

import pytest

from tests.hf_chat_ids import CONVERSATIONS, assert_runs_hf_chat_ids, hf_text_ids
from tinyvllm import LLM, SamplingParams
from tinyvllm.cli import main
from tinyvllm.engine.engine import LLMEngine

pytestmark = pytest.mark.slow  # end to end: chat generations against transformers' ids

ONE_TOKEN = SamplingParams(max_tokens=1)
TEXT = "The sun rose"


@pytest.fixture(scope="module")
def llm():
    return LLM(num_blocks=64, block_size=16, log=lambda message: None)


def test_llm_generate_runs_transformers_chat_ids_and_text_ids(llm):
    ran = []

    def prompt_ids_of(conversations):
        ran.extend(llm.generate([*conversations, TEXT], ONE_TOKEN))
        assert all(o.error is None for o in ran), [o.error for o in ran]
        return [o.prompt_token_ids for o in ran[:-1]]
    assert_runs_hf_chat_ids(prompt_ids_of)
    assert ran[-1].prompt_token_ids == hf_text_ids(TEXT)  # text: the one BOS comes from the post-processor


def test_llm_chat_and_a_single_conversation_run_transformers_chat_ids(llm):  # prefix-cache hits: cheap
    assert_runs_hf_chat_ids(lambda conversations: [o.prompt_token_ids for o in llm.chat(conversations, ONE_TOKEN)])
    assert_runs_hf_chat_ids(lambda conversations: [llm.generate(conversations[0], ONE_TOKEN)[0].prompt_token_ids],
                            CONVERSATIONS[:1])


@pytest.fixture
def engine_outputs(monkeypatch):
    """Every finished RequestOutput LLMEngine.step reports while the test runs the command in-process (the
    command steps the engine itself, for --stream and its progress bar)."""
    seen, step = [], LLMEngine.step

    def recording(self, *args, **kwargs):
        outputs = step(self, *args, **kwargs)
        seen.extend(o for o in outputs if o.finished)
        return outputs
    monkeypatch.setattr(LLMEngine, "step", recording)
    return seen


def generate_command(capsys, *argv):
    code = main(["generate", *argv, "--max-tokens", "1", "--num-blocks", "64", "--quiet-metrics"])
    assert code == 0, capsys.readouterr().err


def test_generate_chat_runs_transformers_chat_ids(capsys, engine_outputs):
    def prompt_ids_of(conversations):  # --chat --system S --prompt P is the conversation [system S, user P]
        (system, user), = conversations
        generate_command(capsys, "--chat", "--system", system["content"], "--prompt", user["content"])
        return [o.prompt_token_ids for o in engine_outputs]
    assert_runs_hf_chat_ids(prompt_ids_of, [[{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"}]])


def test_a_jsonl_messages_line_runs_transformers_chat_ids(capsys, engine_outputs, tmp_path):
    def prompt_ids_of(conversations):
        requests = tmp_path / "requests.jsonl"
        requests.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
        generate_command(capsys, "--prompts-file", str(requests))
        return [o.prompt_token_ids for o in engine_outputs]
    assert_runs_hf_chat_ids(prompt_ids_of, CONVERSATIONS[:1])
