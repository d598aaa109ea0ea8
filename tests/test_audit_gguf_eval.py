"""Behaviours of the GGUF tokenizer import and the eval prompts that no other test pinned (issue 26's
mutation audit): the per-pre-tokenizer BOS default, user-defined (type 4) tokens, and the BOS of a
loglikelihood prompt following --no-special-tokens.

The expectations come from the `tokenizers` library running the demo model's own tokenizer.json (the
vocabulary the test GGUFs are written from), not from the code under test.
"""
import json

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from tinyvllm.evaluation import runner
from tinyvllm.evaluation.runner import EvalConfig, prepare_task
from tinyvllm.evaluation.tasks import Question
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
from tinyvllm.model.gguf import GGUFModelFiles
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.model.weights import expected_tensor_shapes
from tests.gguf_files import byte_level_gguf_tokenizer, write_llama_gguf

BOS = "<|begin_of_text|>"   # the demo tokenizer_config.json's bos_token
USER_DEFINED_ID = 639       # the demo's last added token, turned into a non-special one below


def _demo_tokenizer_json() -> dict:
    return json.loads((DEMO_MODEL_DIR / "tokenizer.json").read_text())


def _write_gguf(path, rng, tokenizer_json: dict, pre: str, add_bos: bool | None):
    """A one-layer model with the demo's vocabulary; the tokenizer stored as llama.cpp's converter does."""
    stored = byte_level_gguf_tokenizer(tokenizer_json, pre, BOS, "<|eot_id|>", add_bos=add_bos)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
              "num_hidden_layers": 1, "vocab_size": len(stored.tokens), "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": True}
    shapes = expected_tensor_shapes(ModelConfig.from_dict(config))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    write_llama_gguf(path, config, weights, stored)
    return GGUFModelFiles.read(path).tokenizer()


def test_llama_bpe_gguf_without_add_bos_key_still_adds_bos(tmp_path, rng):
    """llama.cpp adds BOS to "llama-bpe" (Llama 3) vocabularies when the file has no
    tokenizer.ggml.add_bos_token key, as Meta's tokenizer.json post-processor does."""
    reference = HFTokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    bos_id = reference.token_to_id(BOS)
    plain = reference.encode("Hi", add_special_tokens=False).ids
    assert reference.encode("Hi").ids == [bos_id] + plain   # the reference itself prepends BOS
    ours = _write_gguf(tmp_path / "no_bos_key.gguf", rng, _demo_tokenizer_json(), "llama-bpe", add_bos=None)
    assert ours.encode("Hi") == [bos_id] + plain
    assert ours.encode("Hi", add_special_tokens=False) == plain


def test_user_defined_gguf_token_is_an_added_token_but_not_special(tmp_path, rng):
    """A type-4 (user-defined) token is what llama.cpp's converter writes for a tokenizer.json added token
    with "special": false. It loads back as that: matched whole in text, but not special, so decoding
    with skip_special_tokens keeps its text (transformers' behaviour for such a token)."""
    spec = _demo_tokenizer_json()
    (added,) = [a for a in spec["added_tokens"] if a["id"] == USER_DEFINED_ID]
    added["special"] = False
    reference = HFTokenizer.from_str(json.dumps(spec))
    ours = _write_gguf(tmp_path / "user_defined.gguf", rng, spec, "llama-bpe", add_bos=True)
    stored = byte_level_gguf_tokenizer(spec, "llama-bpe", BOS, "<|eot_id|>", add_bos=True)
    assert stored.token_types[USER_DEFINED_ID] == 4   # the file does hold a user-defined token

    want_special = {a["id"] for a in spec["added_tokens"] if a["special"]}
    assert USER_DEFINED_ID not in want_special
    assert set(ours.special_token_ids) == want_special
    text = f"Hi{added['content']} there"
    ids = reference.encode(text).ids
    assert USER_DEFINED_ID in ids and ours.encode(text) == ids
    assert added["content"] in reference.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_loglikelihood_prompt_has_bos_unless_no_special_tokens(monkeypatch):
    """`tinyvllm eval` (loglikelihood) encodes the prompt as a served text prompt: with the tokenizer's
    BOS, and without it under --no-special-tokens (add_special_tokens=False)."""
    questions = [Question("mmlu", f"s/{i}", "s", f"What is {i} + {i}?", ("1", "2", "3", "4"), i % 4)
                 for i in range(3)]
    monkeypatch.setitem(runner.TASKS, "mmlu", lambda: questions)
    tokenizer = Tokenizer.from_model_dir(DEMO_MODEL_DIR)
    reference = HFTokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    bos_id = reference.token_to_id(BOS)

    with_bos = prepare_task("mmlu", EvalConfig(), tokenizer)
    without = prepare_task("mmlu", EvalConfig(add_special_tokens=False), tokenizer)
    assert with_bos.texts == without.texts
    for text, got_with, got_without in zip(with_bos.texts, with_bos.prompt_ids, without.prompt_ids):
        plain = reference.encode(text, add_special_tokens=False).ids
        assert plain[0] != bos_id
        assert got_with == [bos_id] + plain
        assert got_without == plain
