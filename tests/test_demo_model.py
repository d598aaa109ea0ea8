"""The committed demo model is what tinyvllm/model/fixtures/demo.py builds, and the goldens were made from it."""
import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR, build_demo_model
from tinyvllm.model.llama3_tokenizer import LLAMA3_SPECIAL_TOKENS
from tinyvllm.golden_check import DEFAULT_GOLDENS

GOLDENS = DEFAULT_GOLDENS
MODEL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "model.safetensors"]


@pytest.fixture(scope="module")
def goldens():
    with np.load(GOLDENS) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.fixture(scope="module")
def golden_meta(goldens):
    return json.loads(str(goldens["meta"]))


@pytest.mark.parametrize("name", MODEL_FILES)
def test_rebuild_reproduces_committed_file_byte_for_byte(tmp_path_factory, name):
    rebuilt = tmp_path_factory.getbasetemp() / "rebuilt_demo_model"
    if not rebuilt.exists():
        build_demo_model(rebuilt)
    assert (rebuilt / name).read_bytes() == (DEMO_MODEL_DIR / name).read_bytes(), (
        f"{name} differs from a fresh build: run `python -m tinyvllm.model.fixtures.demo`, then remake the goldens")


def test_special_tokens_sit_at_llama3_offsets_after_the_regular_vocab():
    tokenizer = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert tokenizer.get_vocab_size() == config["vocab_size"] == 384 + 256
    # Offsets as in Llama 3.2 (128000 + offset): the ones an engine relies on, and the last one.
    expected = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|finetune_right_pad_id|>": 4,
                "<|start_header_id|>": 6, "<|end_header_id|>": 7, "<|eom_id|>": 8, "<|eot_id|>": 9,
                "<|python_tag|>": 10, "<|reserved_special_token_3|>": 11,
                "<|reserved_special_token_247|>": 255}
    for token, offset in expected.items():
        assert tokenizer.token_to_id(token) == 384 + offset, token
    assert [tokenizer.id_to_token(384 + i) for i in range(256)] == LLAMA3_SPECIAL_TOKENS
    assert config["bos_token_id"] == 384 and config["eos_token_id"] == [385, 392, 393]
    generation = json.loads((DEMO_MODEL_DIR / "generation_config.json").read_text())
    assert generation["bos_token_id"] == 384 and generation["eos_token_id"] == [385, 392, 393]
    added = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert {int(i): t["content"] for i, t in added.items()} == {384 + i: t for i, t in enumerate(LLAMA3_SPECIAL_TOKENS)}


def test_tokenizer_prepends_bos_and_keeps_special_tokens_whole():
    tokenizer = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    text = "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
    encoding = tokenizer.encode(text)
    assert encoding.ids[:2] == [384, 390] and encoding.ids[-1] == 393
    assert 391 in encoding.ids and all(i < 384 for i in encoding.ids[2:-1] if i != 391)
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == "<|begin_of_text|>" + text


def test_goldens_were_made_from_the_committed_weights(golden_meta):
    digest = hashlib.sha256()
    for shard in sorted(DEMO_MODEL_DIR.glob("*.safetensors")):
        digest.update(shard.read_bytes())
    assert golden_meta["weights_sha256"] == digest.hexdigest(), (
        "demo model weights changed: remake the goldens with `python goldens/make_goldens.py`")


def test_golden_file_holds_every_stage_for_every_prompt(goldens, golden_meta):
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    H, hd, V = config["hidden_size"], config["head_dim"], config["vocab_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    assert len(golden_meta["prompts"]) >= 3
    for p in range(len(golden_meta["prompts"])):
        ids = goldens[f"p{p}.input_ids"]
        T = len(ids)
        assert ids.dtype == np.int32 and 8 <= T <= 48 and ids[0] == 384
        assert goldens[f"p{p}.greedy_ids"].dtype == np.int32
        assert goldens[f"p{p}.greedy_ids"].shape == (golden_meta["max_new_tokens"],)
        for stage in golden_meta["stages"]:
            shape = {"q": (T, nh, hd), "k": (T, nkv, hd), "v": (T, nkv, hd)}.get(stage.split(".")[-1], (T, H))
            if stage == "logits":
                shape = (T, V)
            value = goldens[f"p{p}.{stage}"]
            assert value.dtype == np.float32 and value.shape == shape, stage
            assert np.isfinite(value).all(), stage


def test_golden_attention_matches_causal_gqa_softmax_of_golden_q_k_v(goldens, golden_meta):
    """Ties the captured q/k (after RoPE) and v to the captured attention output: a capture taken at the
    wrong point (e.g. q/k before RoPE) breaks this."""
    for p in range(len(golden_meta["prompts"])):
        for layer in range(2):
            stage = f"p{p}.layers.{layer}."
            q, k, v = (goldens[stage + s].astype(np.float64) for s in ("q", "k", "v"))
            T, nh, hd = q.shape
            group = nh // k.shape[1]
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
            scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, v).reshape(T, nh * hd)
            # HF works in float32: activations here are up to ~10, measured disagreement ~5e-6. 1e-4 leaves
            # room for rounding; q/k captured before RoPE instead would be off by O(1) (measured ~6).
            np.testing.assert_allclose(attn, goldens[stage + "attn"], rtol=0, atol=1e-4)
