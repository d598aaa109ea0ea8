"""The Tokenizer on Llama 3's real vocabulary (built from Meta's tokenizer.model, tinyvllm/model/llama3_tokenizer.py)."""
import json
import math

import pytest
from tokenizers import Regex, pre_tokenizers

from tests.llama3_vocab import llama3_model_dir  # noqa: F401
from tinyvllm.model.chat_template import LLAMA32_CHAT_TEMPLATE
from tinyvllm.model.llama3_tokenizer import LLAMA3_SPLIT_PATTERN, meta_tokenizer_model_path, read_tiktoken_ranks
from tinyvllm.errors import TinyVLLMError
from tinyvllm.model.tokenizer import Tokenizer
from tests.references import require

BOS_ID, EOT_ID = 128000, 128009
MIXED_TEXT = ("Héllo, wörld! 1234567 + 0.5 = ?\n\n\tIndented\r\nline — «quotes» 漢字かな한국어 Привет "
              "🙂🚀👩‍👩‍👧 x²   spaces  \n")
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name 3 primes."},
        {"role": "assistant", "content": "2, 3, 5."}, {"role": "user", "content": "And 🙂?"}]


@pytest.fixture(scope="session")
def tok(llama3_model_dir):  # noqa: F811
    return Tokenizer.from_model_dir(llama3_model_dir)


def test_meta_reference_sentence(tok):
    ids = [2028, 374, 264, 1296, 11914, 13]  # Meta's own check in llama_models' tokenizer tests
    assert tok.encode("This is a test sentence.", add_special_tokens=False) == ids
    assert tok.encode("This is a test sentence.") == [BOS_ID, *ids]


def tiktoken_rule_encode(text: str, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm in plain Python: a pre-token that is a token maps to it; otherwise merge, leftmost
    first, the adjacent pair whose concatenation has the lowest rank until none is a token."""
    ids = []
    for piece, _ in pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated").pre_tokenize_str(text):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1 and b"".join(parts) not in ranks:
            i = min(range(len(parts) - 1), key=lambda j: ranks.get(parts[j] + parts[j + 1], math.inf))
            if parts[i] + parts[i + 1] not in ranks:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[b"".join(parts)]] if b"".join(parts) in ranks else [ranks[p] for p in parts]
    return ids


def test_merges_reproduce_tiktoken(tok):
    ranks = read_tiktoken_ranks(meta_tokenizer_model_path())
    text = MIXED_TEXT + "The quick brown fox's 42nd jump-over; isn't it? CamelCaseIdentifier_x = foo(bar)[0]\n"
    assert tok.encode(text, add_special_tokens=False) == tiktoken_rule_encode(text, ranks)


def test_round_trip_of_mixed_text(tok):
    ids = tok.encode(MIXED_TEXT)
    assert ids[0] == BOS_ID and BOS_ID not in ids[1:]
    assert all(0 <= i < 128000 for i in ids[1:])
    assert tok.decode(ids) == MIXED_TEXT


def test_special_token_in_text_is_one_id_and_decode_can_skip_it(tok):
    text = "Done.<|eot_id|><|start_header_id|>user"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [tok.encode("Done.", add_special_tokens=False)[0], 13, EOT_ID, 128006, 882], ids
    assert tok.decode(ids) == "Done.user"
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_vocabulary_facts(tok):
    assert tok.vocab_size == 128256
    assert tok.bos_token_id == BOS_ID and tok.eos_token_id == EOT_ID
    assert tok.special_token_ids == frozenset(range(128000, 128256))
    assert tok.token_to_id("<|eom_id|>") == 128008 and tok.token_to_id("<|end_of_text|>") == 128001
    assert tok.token_to_id("<|reserved_special_token_247|>") == 128255
    assert tok.token_to_id("<|no_such_token|>") is None


def test_encode_chat_has_one_bos_and_ends_with_the_assistant_header(tok):
    ids = tok.encode_chat(CHAT, date_string="26 Jul 2024")
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1
    assert ids[-4:] == [128006, tok.token_to_id("assistant"), 128007, tok.token_to_id("ĊĊ")]
    assert ids.count(EOT_ID) == 4  # system block + three messages
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(CHAT, date_string="26 Jul 2024")


def test_encode_chat_matches_transformers(tok, llama3_model_dir):  # noqa: F811
    transformers = require("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(llama3_model_dir / "tokenizer.json"), chat_template=LLAMA32_CHAT_TEMPLATE,
        bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    for messages, gen in [(CHAT, True), (CHAT[1:2], True), (CHAT[:3], False)]:
        hf_ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, date_string="26 Jul 2024")
        hf_ids = hf_ids["input_ids"] if hasattr(hf_ids, "keys") else hf_ids  # transformers 5 returns a BatchEncoding
        assert tok.encode_chat(messages, add_generation_prompt=gen, date_string="26 Jul 2024") == list(hf_ids)
    assert tok.encode(MIXED_TEXT) == hf(MIXED_TEXT)["input_ids"]


def write_model_dir(path, tokenizer_json, config):
    path.mkdir()
    (path / "tokenizer.json").symlink_to(tokenizer_json)
    (path / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def test_missing_chat_template_falls_back_to_llama32(tok, llama3_model_dir, tmp_path):  # noqa: F811
    config = {"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>"}  # AddedToken dict form
    bare = Tokenizer.from_model_dir(write_model_dir(tmp_path / "m", llama3_model_dir / "tokenizer.json", config))
    assert bare.chat_template is None and bare.bos_token == "<|begin_of_text|>"
    assert tok.chat_template == LLAMA32_CHAT_TEMPLATE
    assert bare.apply_chat_template(CHAT, date_string="1 Feb 2025") == tok.apply_chat_template(CHAT, date_string="1 Feb 2025")


def test_chat_template_jinja_file_wins(llama3_model_dir, tmp_path):  # noqa: F811
    model_dir = write_model_dir(tmp_path / "m", llama3_model_dir / "tokenizer.json",
                                {"bos_token": "<|begin_of_text|>", "chat_template": "config"})
    (model_dir / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    assert Tokenizer.from_model_dir(model_dir).encode_chat([{"role": "user", "content": "hi"}]) == [BOS_ID, 6151]


@pytest.mark.parametrize("broken, named", [
    ("no_tokenizer_json", "tokenizer.json"),
    ("garbage_tokenizer_json", "tokenizer.json"),
    ("no_config", "tokenizer_config.json"),
    ("garbage_config", "tokenizer_config.json"),
    ("unknown_bos", "tokenizer_config.json"),
])
def test_broken_model_dir_names_the_file(llama3_model_dir, tmp_path, broken, named):  # noqa: F811
    model_dir = write_model_dir(tmp_path / "m", llama3_model_dir / "tokenizer.json",
                                {"bos_token": "<s>"} if broken == "unknown_bos" else {})
    if broken == "no_tokenizer_json":
        (model_dir / "tokenizer.json").unlink()
    elif broken == "garbage_tokenizer_json":
        (model_dir / "tokenizer.json").unlink()
        (model_dir / "tokenizer.json").write_text("{not json")
    elif broken == "no_config":
        (model_dir / "tokenizer_config.json").unlink()
    elif broken == "garbage_config":
        (model_dir / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(TinyVLLMError, match=named.replace(".", r"\.")):
        Tokenizer.from_model_dir(model_dir)
