"""GGUF import (tinyvllm/model/gguf) on small files the tests write with gguf's GGUFWriter (tests/gguf_files.py).

Checked against numpy and the tokenizers the files were written from: every supported tensor type within
its rounding error, llama.cpp's q/k row permutation undone, the config from `llama.*`, both tokenizer
kinds, clear errors for what is not supported, `tinyvllm convert`, and the demo model written as a GGUF
generating the demo model's greedy tokens in the simulator.
"""
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from kernels_numba.rope import rope_inv_freq, rope_ref
from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
from tinyvllm.model.fixtures.demo_corpus import PROSE
from tinyvllm.errors import ModelLoadError
from tinyvllm.model.gguf import GGUFModelFiles, find_gguf_file
from tinyvllm.model.gguf.checkpoint import SUPPORTED_TYPES, permute_rope_rows, unpermute_rope_rows
from tinyvllm.model.gguf.convert import convert
from tinyvllm.model.weights import expected_tensor_shapes
from tests.gguf_files import GGUFTokenizer, byte_level_gguf_tokenizer, write_llama_gguf
from tests.references import require

BF16_ROUNDING = 2.0**-8  # |bf16(x) - x| <= 2^-8 |x|: 8 significant bits, round to nearest

# Texts for tokenizer comparisons: digits (split one by one, or in threes), contractions, runs of spaces
# and newlines, tabs, non-Latin letters and emoji (byte fallback / byte-level), special tokens in the text.
TEXTS = ["The sun rose slowly over the quiet town.", "Numbers 12345, 3.14159 and the year 2024!",
         "don't you'll I'M we've", "  two  spaces,\n\nnew lines\tand a tab ", "Ünïcödé, 日本語 and 🤖 emoji",
         "<|im_start|>user\nHi there<|im_end|>\n", "", " ", "x"]


def _tiny_config(hidden=256, heads=4, kv_heads=2, inter=256, layers=1, vocab=300, **extra) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": inter,
            "num_hidden_layers": layers, "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 512, "tie_word_embeddings": True, **extra}


def _random_weights(rng, config: dict) -> dict[str, np.ndarray]:
    from tinyvllm.model.config import ModelConfig
    shapes = expected_tensor_shapes(ModelConfig.from_dict(config))
    return {name: ((1 + 0.1 * rng.standard_normal(shape)) if len(shape) == 1 else rng.standard_normal(shape))
            .astype(np.float32) for name, shape in shapes.items()}


def _trained_byte_level_tokenizer() -> Tokenizer:
    """A small SmolLM2-shaped tokenizer: byte-level BPE, digits split one by one, three specials first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[AddedToken(t, special=True, normalized=False) for t in
                                                  ("<|endoftext|>", "<|im_start|>", "<|im_end|>")],
                                  show_progress=False)
    tok.train_from_iterator([PROSE], trainer)
    # One merge of two digits, which only "smollm"'s digit split keeps from ever applying (SmolLM2's own
    # merges join no digits, so without it a loader that forgot the split would still pass).
    spec = json.loads(tok.to_str())
    spec["model"]["vocab"]["12"] = len(spec["model"]["vocab"])
    spec["model"]["merges"].append(["1", "2"])
    return Tokenizer.from_str(json.dumps(spec))


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def byte_level():
    """(the trained tokenizer, how it is stored in a GGUF)."""
    tok = _trained_byte_level_tokenizer()
    stored = byte_level_gguf_tokenizer(json.loads(tok.to_str()), "smollm", "<|im_start|>", "<|im_end|>",
                                       add_bos=False, chat_template=CHATML)
    return tok, stored


def _write(tmp_path, rng, stored: GGUFTokenizer, types="F32", name="model.gguf", **config_extra):
    config = _tiny_config(vocab=len(stored.tokens), **config_extra)
    weights = _random_weights(rng, config)
    path = tmp_path / name
    bounds = write_llama_gguf(path, config, weights, stored, types)
    return path, config, weights, bounds


# ---- the q/k permutation ----

def test_unpermute_undoes_llama_cpp_row_order():
    """Per head, file row 2i + j holds Hugging Face row j * head_dim/2 + i."""
    n_heads, head_dim, cols = 3, 8, 5
    hf = np.arange(n_heads * head_dim * cols, dtype=np.float32).reshape(n_heads * head_dim, cols)
    stored = permute_rope_rows(hf, n_heads)
    for h in range(n_heads):
        for i in range(head_dim // 2):
            for j in range(2):
                np.testing.assert_array_equal(stored[h * head_dim + 2 * i + j], hf[h * head_dim + j * head_dim // 2 + i])
    np.testing.assert_array_equal(unpermute_rope_rows(stored, n_heads), hf)


def test_llama_cpp_rope_on_permuted_rows_is_hf_rope(rng):
    """What the permutation is for: llama.cpp rotates adjacent pairs (y[2i], y[2i+1]) of the file's rows;
    Hugging Face rotates halves (y[i], y[i + hd/2]) of its own. Same angles, so the same vectors after
    undoing the row order: the loader's unpermute is the one that makes rotate-half kernels right."""
    n_heads, head_dim, hidden, tokens = 3, 16, 24, 5
    w = rng.standard_normal((n_heads * head_dim, hidden)).astype(np.float32)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    positions = np.arange(tokens, dtype=np.int32) * 7
    inv_freq = rope_inv_freq(head_dim, 10000.0, None)
    want = rope_ref((x @ w.T).reshape(tokens, n_heads, head_dim), positions, inv_freq)
    y = (x @ permute_rope_rows(w, n_heads).T).reshape(tokens, n_heads, head_dim // 2, 2)
    angle = positions[:, None, None].astype(np.float32) * inv_freq[None, None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    pairs = np.stack([y[..., 0] * cos - y[..., 1] * sin, y[..., 1] * cos + y[..., 0] * sin], axis=-1)
    got = unpermute_rope_rows(pairs.reshape(tokens, n_heads * head_dim).T, n_heads).T
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


# ---- tensor types ----

def _values(array: np.ndarray) -> np.ndarray:
    return (array.view(ml_dtypes.bfloat16) if array.dtype == np.uint16 else array).astype(np.float64)


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
def test_every_type_loads_within_its_rounding_error(tmp_path, rng, byte_level, type_name):
    """Each stored weight, as loaded, is within the type's error bound (tests/gguf_files.py says each), in
    Hugging Face row order. Quantized files load as bf16: plus one bf16 rounding of the value, for the F32
    norms too. Files of F32 / F16 / BF16 tensors (with F32 norms) load as float32, exactly what they hold, as
    the safetensors loader does. Hidden and intermediate 256: whole K-quant super-blocks per row."""
    path, config, weights, bounds = _write(tmp_path, rng, byte_level[1], type_name)
    files = GGUFModelFiles.read(path)
    notices = []
    loaded = files.weights(files.model_config(), notices=notices)
    quantized = type_name not in ("F32", "F16", "BF16")
    assert set(loaded) == set(weights) and len(notices) == 1
    assert ("dequantized to bf16" if quantized else "computing with float32 weights") in notices[0]
    for name, original in weights.items():
        assert loaded[name].dtype == (np.uint16 if quantized else np.float32), name
        got = _values(loaded[name])
        assert got.shape == original.shape, name
        bound = bounds[name] + (BF16_ROUNDING * (np.abs(original) + bounds[name]) if quantized else 0)
        err = np.abs(got - original)
        assert (err <= bound).all(), f"{name}: max err {err.max():.3g}, worst err/bound {(err / bound).max():.3g}"


def test_separate_output_weight_and_head_dim_from_key_length(tmp_path, rng, byte_level):
    """output.weight present: untied lm_head; head_dim from llama.attention.key_length when it is not
    hidden / heads (here 4 heads of 32 in a hidden of 256)."""
    path, config, weights, _ = _write(tmp_path, rng, byte_level[1], "Q8_0", tie_word_embeddings=False, head_dim=32)
    files = GGUFModelFiles.read(path)
    c = files.model_config()
    assert (c.tie_word_embeddings, c.head_dim) == (False, 32)
    loaded = files.weights(c, notices=[])
    np.testing.assert_allclose(_values(loaded["lm_head.weight"]), weights["lm_head.weight"], atol=0.05)


def test_config_from_metadata(tmp_path, rng, byte_level):
    path, config, _, _ = _write(tmp_path, rng, byte_level[1], rope_scaling={"rope_type": "linear", "factor": 4.0})
    c = GGUFModelFiles.read(path).model_config()
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
            c.num_hidden_layers, c.vocab_size, c.max_position_embeddings) == (256, 4, 2, 64, 256, 1,
                                                                              len(byte_level[1].tokens), 512)
    assert c.rms_norm_eps == pytest.approx(1e-5, rel=1e-6) and c.rope_theta == 10000.0
    assert c.rope_scaling == {"rope_type": "linear", "factor": 4.0} and c.tie_word_embeddings
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))


# ---- tokenizers ----

def test_byte_level_tokenizer_matches_the_one_it_was_written_from(tmp_path, rng, byte_level):
    """SmolLM2's kind: byte-level BPE with pre-tokenizer "smollm" (digits one by one, then GPT-2's split),
    control tokens as specials with their own ids, no bos added, the chat template from the file."""
    trained, stored = byte_level
    path, *_ = _write(tmp_path, rng, stored)
    files = GGUFModelFiles.read(path)
    ours = files.tokenizer()
    assert ours.vocab_size == trained.get_vocab_size() == len(stored.tokens)
    for text in TEXTS:
        want = trained.encode(text).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want, skip_special_tokens=False) == trained.decode(want, skip_special_tokens=False)
    assert ours.special_token_ids == {0, 1, 2}
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    messages = [{"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert ours.encode_chat(messages)[:1] == [1]


def test_sentencepiece_tokenizer_matches_sentencepiece(tmp_path, rng):
    """A Llama-2-style vocabulary: sentencepiece BPE with byte fallback, stored as llama.cpp's converter
    stores it (pieces, scores, types, no merges). Encodes as sentencepiece itself does, with bos."""
    spm = require("sentencepiece", "pip install -e '.[gguf-tests]'")
    import io
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(PROSE.splitlines()), model_writer=model, model_type="bpe",
                                   vocab_size=400, byte_fallback=True, character_coverage=1.0,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   add_dummy_prefix=True, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    kinds = [2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 6 if sp.IsByte(i) else 5 if sp.IsUnused(i) else 1
             for i in range(sp.GetPieceSize())]
    stored = GGUFTokenizer("llama", [sp.IdToPiece(i) for i in range(sp.GetPieceSize())], kinds,
                           scores=[sp.GetScore(i) for i in range(sp.GetPieceSize())], bos_id=sp.bos_id(),
                           eos_id=sp.eos_id(), unknown_id=sp.unk_id())
    path, *_ = _write(tmp_path, rng, stored)
    ours = GGUFModelFiles.read(path).tokenizer()
    for text in TEXTS + ["Maria walked to the market every Saturday morning.", "é\u00e9 ą ½ ünseen"]:
        if "<|" in text:
            continue  # not special tokens to this vocabulary; sentencepiece and llama.cpp split them differently
        want = [sp.bos_id()] + sp.encode(text)
        assert ours.encode(text) == want, text
        assert ours.decode(want) == sp.decode(want), text


# ---- errors ----

def test_unsupported_tensor_type_is_named(tmp_path, rng, byte_level):
    config = _tiny_config(vocab=len(byte_level[1].tokens))
    weights = _random_weights(rng, config)
    down = weights.pop("model.layers.0.mlp.down_proj.weight")
    q2_k = np.zeros((down.shape[0], 84), np.uint8)  # Q2_K: 84 bytes per 256 values, which tinyvllm does not read
    write_llama_gguf(tmp_path / "q2k.gguf", config, weights, byte_level[1],
                     extra_tensors={"blk.0.ffn_down.weight": (q2_k, "Q2_K")})
    _expect_error(tmp_path / "q2k.gguf", r"blk\.0\.ffn_down\.weight has type Q2_K, which tinyvllm does not "
                                          r"dequantize \(supported: F32, F16, BF16, Q8_0")


def _expect_error(path, pattern):
    with pytest.raises(ModelLoadError, match=pattern):
        files = GGUFModelFiles.read(path)
        files.tokenizer()
        files.weights(files.model_config())


def test_unsupported_architecture_is_named(tmp_path, rng, byte_level):
    config = _tiny_config(vocab=len(byte_level[1].tokens))
    write_llama_gguf(tmp_path / "q.gguf", config, _random_weights(rng, config), byte_level[1], arch="qwen2")
    _expect_error(tmp_path / "q.gguf", r"architecture 'qwen2' is not supported")


def test_unknown_pre_tokenizer_is_named(tmp_path, rng, byte_level):
    stored = byte_level_gguf_tokenizer(json.loads(byte_level[0].to_str()), "deepseek-coder", None, None, None)
    path, *_ = _write(tmp_path, rng, stored)
    _expect_error(path, r"tokenizer\.ggml\.pre 'deepseek-coder' is not supported")


def test_missing_and_unexpected_tensors_are_named(tmp_path, rng, byte_level):
    config = _tiny_config(vocab=len(byte_level[1].tokens))
    weights = _random_weights(rng, config)
    del weights["model.layers.0.mlp.up_proj.weight"]
    write_llama_gguf(tmp_path / "a.gguf", config, weights, byte_level[1])
    _expect_error(tmp_path / "a.gguf", r"missing tensor blk\.0\.ffn_up\.weight \(expected shape \[256, 256\]\)")
    weights = _random_weights(rng, config)
    write_llama_gguf(tmp_path / "b.gguf", config, weights, byte_level[1],
                     extra_tensors={"blk.0.attn_q.bias": np.zeros(256, np.float32)})
    _expect_error(tmp_path / "b.gguf", r"unexpected tensor blk\.0\.attn_q\.bias")


def test_not_a_gguf_and_ambiguous_directories(tmp_path, rng, byte_level):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        find_gguf_file(bad)
    truncated = tmp_path / "t" / "cut.gguf"
    truncated.parent.mkdir()
    path, *_ = _write(tmp_path, rng, byte_level[1])
    truncated.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        GGUFModelFiles.read(truncated)
    (tmp_path / "second.gguf").write_bytes(path.read_bytes())
    with pytest.raises(ModelLoadError, match=r"3 \.gguf files"):
        find_gguf_file(tmp_path)
    assert find_gguf_file(truncated.parent) == truncated
    assert find_gguf_file(DEMO_MODEL_DIR) is None


def test_cli_reports_a_bad_gguf_in_one_line(tmp_path, capsys):
    from tinyvllm.cli import main
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 20)
    assert main(["convert", str(bad), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "bad.gguf: not a readable GGUF file" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


# ---- convert ----

def test_convert_writes_an_hf_directory_that_loads_the_same(tmp_path, rng, byte_level):
    from tinyvllm.model.config import GenerationDefaults, ModelConfig
    from tinyvllm.model.tokenizer import Tokenizer as OurTokenizer
    from tinyvllm.model.weights import load_weights
    path, *_ = _write(tmp_path, rng, byte_level[1], "Q4_K")
    out = tmp_path / "hf"
    written = convert(path, out, log=lambda _: None)
    assert sorted(p.name for p in written) == ["config.json", "generation_config.json", "model.safetensors",
                                               "tokenizer.json", "tokenizer_config.json"]
    files = GGUFModelFiles.read(path)
    config = ModelConfig.from_model_dir(out)
    assert config == files.model_config()
    assert GenerationDefaults.from_model_dir(out) == files.generation_defaults()
    from_dir, from_gguf = load_weights(out, config, notices=[]), files.weights(config, notices=[])
    for name in from_gguf:
        np.testing.assert_array_equal(from_dir[name], from_gguf[name])
    tokenizer = OurTokenizer.from_model_dir(out)
    assert tokenizer.chat_template == CHATML
    for text in TEXTS:
        assert tokenizer.encode(text) == files.tokenizer().encode(text)
    transformers = require("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(out)  # what goldens/make_goldens.py reads
    for text in TEXTS:
        assert hf(text)["input_ids"] == tokenizer.encode(text), text


# ---- the demo model as a GGUF, end to end in the simulator ----

def _demo_as_gguf(path: Path, types) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    tok_config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    stored = byte_level_gguf_tokenizer(json.loads((DEMO_MODEL_DIR / "tokenizer.json").read_text()), "llama-bpe",
                                       tok_config["bos_token"], tok_config["eos_token"], add_bos=True,
                                       chat_template=tok_config["chat_template"])
    stored.extra_ids = {"eom": stored.tokens.index("<|eom_id|>")}
    bf16 = load_file(DEMO_MODEL_DIR / "model.safetensors")
    weights = {name: w.view(ml_dtypes.bfloat16).astype(np.float32) if w.dtype == np.uint16 else w.astype(np.float32)
               for name, w in bf16.items()}
    write_llama_gguf(path, config, weights, stored, types)
    return {name: w.view(np.uint16) for name, w in bf16.items()}


def test_demo_model_as_gguf_is_the_demo_model(tmp_path):
    """The demo model written as a GGUF (F32 and BF16 weights: exact; llama3 RoPE as rope_freqs.weight,
    the Llama 3 byte-level tokenizer as "llama-bpe") loads as the demo model: the same config, equal
    values, the same tokenizer, chat template and bos/eos."""
    from tinyvllm.model.config import ModelConfig
    from tinyvllm.model.tokenizer import Tokenizer as OurTokenizer
    demo_tokenizer = OurTokenizer.from_model_dir(DEMO_MODEL_DIR)
    demo_config = ModelConfig.from_model_dir(DEMO_MODEL_DIR)
    types = {name: ("BF16" if "mlp" in name else "F32") for name in expected_tensor_shapes(demo_config)}
    want = _demo_as_gguf(tmp_path / "demo.gguf", types)
    files = GGUFModelFiles.read(tmp_path / "demo.gguf")
    config = files.model_config()
    assert config.rope_scaling == demo_config.rope_scaling
    assert config == demo_config.__class__(**{**demo_config.__dict__, "eos_token_ids": (393,)})
    np.testing.assert_array_equal(rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling),
                                  rope_inv_freq(demo_config.head_dim, demo_config.rope_theta, demo_config.rope_scaling))
    loaded = files.weights(config, notices=[])  # F32 and BF16 tensors: float32, each the demo's bf16 value widened
    for name, bits in want.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], _values(bits).astype(np.float32), err_msg=name)
    ours = files.tokenizer()
    for text in TEXTS + [PROSE[:400], "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"]:
        assert ours.encode(text) == demo_tokenizer.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == demo_tokenizer.encode(text, add_special_tokens=False)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert ours.encode_chat(messages, date_string="26 Jul 2024") == demo_tokenizer.encode_chat(
        messages, date_string="26 Jul 2024")
    assert (ours.bos_token, ours.eos_token, ours.special_token_ids) == (
        demo_tokenizer.bos_token, demo_tokenizer.eos_token, demo_tokenizer.special_token_ids)
    assert files.generation_defaults().eos_token_ids == (393, 392)


def test_demo_gguf_generates_the_demo_greedy_tokens(tmp_path):
    """`generate --model demo.gguf`, in the simulator: the first golden prompt tokenizes to the golden ids
    and its greedy continuation is the golden one (which the demo directory reproduces in
    tests/test_goldens_demo.py): the GGUF path runs the same model."""
    from tinyvllm.cli import main
    from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
    from tinyvllm.llm import LLM
    from tinyvllm.engine.sampling_params import SamplingParams
    goldens = Goldens.load(DEFAULT_GOLDENS)
    _demo_as_gguf(tmp_path / "demo.gguf", "F32")
    llm = LLM(str(tmp_path), num_blocks=16, max_num_seqs=1)  # the directory holding one .gguf
    golden = goldens.prompts[0]
    assert llm.engine.tokenizer.encode(goldens.meta["prompts"][0]) == golden["input_ids"].tolist()
    out = llm.generate([golden["input_ids"].tolist()], SamplingParams(temperature=0.0, max_tokens=len(
        golden["greedy_ids"]), ignore_eos=True))[0]
    assert out.token_ids == golden["greedy_ids"].tolist()


def test_config_only_commands_take_a_gguf(tmp_path, capsys):
    """`trace --list` and `--use-generation-config` read the config / generation defaults without loading
    weights: from the GGUF metadata too."""
    from tinyvllm.cli import main
    from tinyvllm.model.loader import read_generation_defaults, read_model_config
    _demo_as_gguf(tmp_path / "demo.gguf", "F32")
    assert main(["trace", "--model", str(tmp_path / "demo.gguf"), "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed[0] == "embedding" and "layers.1.output" in listed and listed[-1] == "logits"
    assert read_model_config(tmp_path).num_hidden_layers == 2
    assert read_generation_defaults(tmp_path / "demo.gguf").eos_token_ids == (393, 392)
