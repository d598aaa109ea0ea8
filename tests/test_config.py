import dataclasses
import json
import re

import pytest

from tinyvllm.model.config import GenerationDefaults, ModelConfig
from tinyvllm.errors import ModelLoadError, TinyVLLMError

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}

# Llama 3.2 1B Instruct's config.json as published (transformers 4.45 layout).
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-05, "max_position_embeddings": 131072,
    "rope_theta": 500000.0, "rope_scaling": LLAMA3_SCALING, "tie_word_embeddings": True,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}

_DROP = object()  # a key tiny_config_dict should leave out


def tiny_config_dict(**overrides):
    """A tiny Llama config.json in the transformers 4.x layout, without head_dim."""
    d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 19, "hidden_size": 12,
         "intermediate_size": 20, "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1,
         "hidden_act": "silu", "rms_norm_eps": 1e-05, "max_position_embeddings": 64, "rope_theta": 10000.0,
         "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    d.update(overrides)
    return {k: v for k, v in d.items() if v is not _DROP}


def load_error(d, match):
    with pytest.raises(ModelLoadError, match=match):
        ModelConfig.from_dict(d, source="some/dir/config.json")


def test_llama_32_1b_published_config():
    c = ModelConfig.from_dict(LLAMA_32_1B)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (128256, 2048, 8192, 16)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 8, 64)
    assert (c.rms_norm_eps, c.rope_theta, c.max_position_embeddings) == (1e-05, 500000.0, 131072)
    assert c.rope_scaling == LLAMA3_SCALING
    assert c.tie_word_embeddings is True
    assert c.bos_token_id == 128000 and c.eos_token_ids == (128001, 128008, 128009)


def test_transformers5_layout_reads_as_the_4x_layout():
    v4 = dict(LLAMA_32_1B)
    v5 = {k: v for k, v in LLAMA_32_1B.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA3_SCALING}  # as transformers 5.x writes it
    assert ModelConfig.from_dict(v5) == ModelConfig.from_dict(v4)


def test_transformers5_default_rope_type_means_no_scaling():
    c = ModelConfig.from_dict(tiny_config_dict(rope_theta=_DROP, rope_scaling=_DROP,
                                               rope_parameters={"rope_theta": 1234.0, "rope_type": "default"}))
    assert c.rope_theta == 1234.0 and c.rope_scaling is None


def test_legacy_rope_scaling_type_key_is_renamed():
    c = ModelConfig.from_dict(tiny_config_dict(rope_scaling={"type": "linear", "factor": 2.0}))
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads():
    c = ModelConfig.from_dict(tiny_config_dict(num_key_value_heads=_DROP))
    assert c.head_dim == 12 // 3 and c.num_key_value_heads == 3
    assert ModelConfig.from_dict(tiny_config_dict(head_dim=6)).head_dim == 6


def test_architectures_alone_identify_llama():
    assert ModelConfig.from_dict(tiny_config_dict(model_type=_DROP)).hidden_size == 12


@pytest.mark.parametrize("eos, want", [(2, (2,)), ([5, 7], (5, 7)), (None, ())])
def test_eos_token_id_int_list_or_null(eos, want):
    assert ModelConfig.from_dict(tiny_config_dict(eos_token_id=eos)).eos_token_ids == want


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig.from_dict(tiny_config_dict()).hidden_size = 4


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads"])
def test_missing_required_key_names_file_and_key(key):
    load_error(tiny_config_dict(**{key: _DROP}), rf"some/dir/config\.json: missing required key '{key}'")


def test_not_llama_names_what_was_found():
    load_error(tiny_config_dict(model_type="mistral", architectures=["MistralForCausalLM"]),
               r"config\.json: not a Llama model \(model_type 'mistral', architectures \['MistralForCausalLM'\]\)")


@pytest.mark.parametrize("overrides, match", [
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
    ({"attention_bias": True}, r"attention_bias is true"),
    ({"mlp_bias": True}, r"mlp_bias is true"),
    ({"num_key_value_heads": 2}, r"num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
    ({"head_dim": 5}, r"head_dim 5 is odd"),
    ({"hidden_size": 13}, r"no head_dim and hidden_size 13 is not a multiple of num_attention_heads 3"),
    ({"vocab_size": 0}, r"vocab_size must be a positive integer, got 0"),
    ({"eos_token_id": "2"}, r"eos_token_id must be a token id"),
    ({"rope_scaling": {"factor": 2.0}}, r"rope_scaling has no rope_type"),
])
def test_unsupported_or_inconsistent_config_is_refused(overrides, match):
    load_error(tiny_config_dict(**overrides), r"some/dir/config\.json: " + match)


def test_from_model_dir_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config_dict()))
    assert ModelConfig.from_model_dir(tmp_path) == ModelConfig.from_dict(tiny_config_dict())


def test_missing_config_json_names_the_file(tmp_path):
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(tmp_path))}/config\.json: file not found"):
        ModelConfig.from_model_dir(tmp_path)


def test_invalid_json_names_file_and_line(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "hidden_size": 8,\n  "vocab_size": ,\n}')
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(tmp_path))}/config\.json: invalid JSON at line 3") as e:
        ModelConfig.from_model_dir(tmp_path)
    assert isinstance(e.value, TinyVLLMError)


def test_generation_defaults_absent_file_gives_all_none(tmp_path):
    assert GenerationDefaults.from_model_dir(tmp_path) == GenerationDefaults(None, None, None, None, None, None)


def test_generation_defaults_from_file(tmp_path):
    # Llama 3.2 1B Instruct's generation_config.json, plus top_k and max_new_tokens.
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
         "temperature": 0.6, "top_p": 0.9, "top_k": 50, "max_new_tokens": 256, "transformers_version": "4.45.0"}))
    g = GenerationDefaults.from_model_dir(tmp_path)
    assert g == GenerationDefaults(temperature=0.6, top_p=0.9, top_k=50, do_sample=True, max_new_tokens=256,
                                   eos_token_ids=(128001, 128008, 128009))


def test_generation_defaults_partial_and_int_eos():
    assert GenerationDefaults.from_dict({"eos_token_id": 7, "temperature": 1}) == \
        GenerationDefaults(temperature=1.0, eos_token_ids=(7,))


def test_generation_defaults_errors_name_the_file(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text('{"top_p": 0.9,\n "temperature": }')
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(path))}: invalid JSON at line 2"):
        GenerationDefaults.from_model_dir(tmp_path)
    path.write_text('{"top_p": 1.5}')
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(path))}: top_p must be a number in \(0, 1\], got 1.5"):
        GenerationDefaults.from_model_dir(tmp_path)
