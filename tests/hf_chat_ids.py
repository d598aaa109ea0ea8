"""The token ids a chat conversation must run as, from an implementation independent of tinyvllm's: transformers'
`apply_chat_template(messages, tokenize=True, add_generation_prompt=True)` on the model directory's own
tokenizer.json and tokenizer_config.json (its chat template). The template writes the one BOS; nothing may add
a second.

`assert_runs_hf_chat_ids(prompt_ids_of)` is for every path a conversation can take into the engine (LLM,
`generate --chat`, a JSONL `messages` line: tests/test_chat_ids.py; the server's /v1/chat/completions:
tests/test_serving_http.py): `prompt_ids_of(conversations)` runs them through that path and returns the prompt
token ids the engine ran for each, e.g. RequestOutput.prompt_token_ids.
"""
from functools import lru_cache

from tests.references import require
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR

# A system message, several turns, whitespace the template trims (58 ids); a lone user message (39 ids).
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi\n"},
     {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "and?"}],
    [{"role": "user", "content": "Hi"}],
]


@lru_cache(maxsize=None)
def _hf_tokenizer(model_dir: str):
    return require("transformers").AutoTokenizer.from_pretrained(model_dir)


def hf_text_ids(text: str, model_dir=DEMO_MODEL_DIR) -> list[int]:
    """A plain text prompt's ids as transformers encodes it (special tokens on: one BOS)."""
    return list(_hf_tokenizer(str(model_dir))(text)["input_ids"])


def hf_chat_ids(messages, model_dir=DEMO_MODEL_DIR) -> list[int]:
    ids = _hf_tokenizer(str(model_dir)).apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 returns a BatchEncoding


def assert_runs_hf_chat_ids(prompt_ids_of, conversations=CONVERSATIONS, model_dir=DEMO_MODEL_DIR):
    """`prompt_ids_of(conversations)` -> the prompt ids the engine ran for each conversation: each must be
    transformers' chat ids for it, with exactly one BOS."""
    before = [hf_chat_ids(c, model_dir) for c in conversations]
    got = [list(ids) for ids in prompt_ids_of(conversations)]
    after = [hf_chat_ids(c, model_dir) for c in conversations]  # the template dates the prompt: either day
    assert len(got) == len(conversations), (len(got), len(conversations))
    bos = _hf_tokenizer(str(model_dir)).bos_token_id
    for i, ids in enumerate(got):
        assert ids in (before[i], after[i]), f"conversation {i}: ran {ids}, transformers gives {before[i]}"
        assert ids.count(bos) == 1 and ids[0] == bos, f"conversation {i}: {ids.count(bos)} BOS"
