import json
import re

import ml_dtypes  # before safetensors, so safetensors.numpy knows bfloat16 arrays
import numpy as np
import pytest
from safetensors.numpy import save_file

from tinyvllm.model.config import ModelConfig
from tinyvllm.errors import ModelLoadError
from tinyvllm.model.weights import expected_tensor_shapes, load_weights

K_PROJ = "model.layers.0.self_attn.k_proj.weight"


def tiny_config(tied=False, layers=2):
    """hidden 8, 2 heads of 4 sharing 1 KV head, intermediate 12, vocab 19."""
    return ModelConfig.from_dict({
        "model_type": "llama", "vocab_size": 19, "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 32,
        "tie_word_embeddings": tied, "eos_token_id": 2})


def random_checkpoint(config, rng, dtype=ml_dtypes.bfloat16):
    return {name: (rng.standard_normal(shape) * 3).astype(np.float32).astype(dtype)
            for name, shape in expected_tensor_shapes(config).items()}


def bf16_bits(array):
    """What the loader must return: bf16 bit patterns, rounded to nearest even by ml_dtypes."""
    return np.asarray(array).astype(ml_dtypes.bfloat16).view(np.uint16)


def read_header(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_raw(path, header, data):
    """A safetensors file from a header dict and data bytes, for headers save_file would never write."""
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


def test_expected_shapes_of_a_tiny_untied_model():
    shapes = expected_tensor_shapes(tiny_config(layers=1))
    assert shapes == {
        "model.embed_tokens.weight": (19, 8),
        "model.layers.0.input_layernorm.weight": (8,),
        "model.layers.0.self_attn.q_proj.weight": (8, 8),
        "model.layers.0.self_attn.k_proj.weight": (4, 8),
        "model.layers.0.self_attn.v_proj.weight": (4, 8),
        "model.layers.0.self_attn.o_proj.weight": (8, 8),
        "model.layers.0.post_attention_layernorm.weight": (8,),
        "model.layers.0.mlp.gate_proj.weight": (12, 8),
        "model.layers.0.mlp.up_proj.weight": (12, 8),
        "model.layers.0.mlp.down_proj.weight": (8, 12),
        "model.norm.weight": (8,),
        "lm_head.weight": (19, 8),
    }
    assert "lm_head.weight" not in expected_tensor_shapes(tiny_config(tied=True))
    assert len(expected_tensor_shapes(tiny_config(layers=2))) == 1 + 2 * 9 + 2


def test_bf16_loads_bit_exact_and_zero_copy(tmp_path, rng):
    config = tiny_config()
    tensors = random_checkpoint(config, rng)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    calls, notices = [], []
    weights = load_weights(tmp_path, config, progress=lambda done, total: calls.append((done, total)),
                           notices=notices)
    assert weights.keys() == tensors.keys()
    for name, want in tensors.items():
        got = weights[name]
        assert got.dtype == np.uint16 and got.shape == want.shape
        np.testing.assert_array_equal(got, want.view(np.uint16))
        assert not got.flags.writeable and not got.flags.owndata  # a view of the memory-mapped file
    total = len(tensors)
    assert calls == [(i, total) for i in range(1, total + 1)]
    assert notices == []


def test_tied_checkpoint_ignores_lm_head_and_extra_tensors(tmp_path, rng):
    config = tiny_config(tied=True)
    tensors = random_checkpoint(config, rng)
    extras = {"lm_head.weight": rng.standard_normal((19, 8)).astype(ml_dtypes.bfloat16),
              "model.layers.0.self_attn.rotary_emb.inv_freq": np.arange(2, dtype=np.float32),
              "some.int_buffer": np.arange(3, dtype=np.int64)}
    save_file(tensors | extras, str(tmp_path / "model.safetensors"))
    assert load_weights(tmp_path, config).keys() == tensors.keys()


def test_untied_checkpoint_without_lm_head_is_refused(tmp_path, rng):
    tied_tensors = random_checkpoint(tiny_config(tied=True), rng)
    save_file(tied_tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError) as e:
        load_weights(tmp_path, tiny_config(tied=False))
    assert str(e.value) == "lm_head.weight: missing from model.safetensors (expected shape (19, 8))"


@pytest.mark.parametrize("dtype, name", [(np.float32, "F32"), (np.float16, "F16")])
def test_f32_and_f16_keep_their_values_as_float32_with_one_notice(tmp_path, rng, dtype, name):
    config = tiny_config()
    tensors = random_checkpoint(config, rng, dtype)
    # Values no bf16 can hold (low mantissa bits set), which rounding to bf16 would change: kept exactly.
    precise = np.array([0x3F808001, 0x3F81FFFF, 0xC0498123, 0x40C97FFF], dtype=np.uint32).view(np.float32)
    tensors["model.norm.weight"] = np.concatenate([precise, precise / 2]).astype(dtype)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    notices = []
    weights = load_weights(tmp_path, config, notices=notices)
    for tensor_name, array in tensors.items():
        assert weights[tensor_name].dtype == np.float32
        np.testing.assert_array_equal(weights[tensor_name], array.astype(np.float64))  # F16 -> F32 is exact
    if dtype == np.float32:
        np.testing.assert_array_equal(weights["model.norm.weight"][:4].view(np.uint32), precise.view(np.uint32))
    assert len(notices) == 1
    assert f"{len(tensors)} {name} tensors: computing with float32 weights" in notices[0]


def test_float32_notice_is_a_warning_without_a_notices_list(tmp_path, rng):
    config = tiny_config(layers=1)
    save_file(random_checkpoint(config, rng, np.float32), str(tmp_path / "model.safetensors"))
    with pytest.warns(UserWarning, match="F32 tensors: computing with float32 weights") as record:
        load_weights(tmp_path, config)
    assert len(record) == 1


def write_sharded(tmp_path, tensors, shard_of):
    """Shards model-0000{k}-of-00002.safetensors and the index that maps each tensor to its shard."""
    shard_names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {name: shard_names[shard_of(name)] for name in tensors}
    for k, shard in enumerate(shard_names):
        save_file({n: t for n, t in tensors.items() if weight_map[n] == shard}, str(tmp_path / shard))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    return weight_map


def test_sharded_checkpoint_with_mixed_dtypes(tmp_path, rng):
    config = tiny_config()
    bf16 = random_checkpoint(config, rng)
    tensors = {n: t if "layers.1." not in n else t.astype(np.float32) for n, t in bf16.items()}
    write_sharded(tmp_path, tensors, shard_of=lambda n: int("layers.1." in n or n == "lm_head.weight"))
    notices = []
    weights = load_weights(tmp_path, config, notices=notices)
    assert weights.keys() == tensors.keys()
    for name, array in bf16.items():  # one dtype for the model: float32, the BF16 tensors widened exactly
        assert weights[name].dtype == np.float32
        np.testing.assert_array_equal(weights[name], array.astype(np.float32))
    assert len(notices) == 1 and notices[0].endswith(": 12 BF16, 9 F32 tensors: computing with float32 weights "
                                                     "(BF16 widened exactly)")


def load_error(model_dir, config=None):
    with pytest.raises(ModelLoadError) as e:
        load_weights(model_dir, config or tiny_config())
    return str(e.value)


def test_no_checkpoint_names_both_files(tmp_path):
    assert load_error(tmp_path) == f"{tmp_path}: no model.safetensors nor model.safetensors.index.json"


def test_broken_index_json_names_file_and_line(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{\n "weight_map": {\n  "a": \n}')
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/model\.safetensors\.index\.json: invalid JSON at line 4, .*",
                        load_error(tmp_path))


def test_index_without_weight_map(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    assert "model.safetensors.index.json: no weight_map object" in load_error(tmp_path)


def test_index_naming_a_missing_shard(tmp_path, rng):
    config = tiny_config()
    write_sharded(tmp_path, random_checkpoint(config, rng), shard_of=lambda n: int("layers.1." in n))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    assert load_error(tmp_path) == (
        "model.safetensors.index.json: shard 'model-00002-of-00002.safetensors', which holds "
        f"model.layers.1.input_layernorm.weight, is not in {tmp_path}")


def test_index_missing_a_tensor(tmp_path, rng):
    tensors = random_checkpoint(tiny_config(), rng)
    del tensors["model.norm.weight"]
    write_sharded(tmp_path, tensors, shard_of=lambda n: 0)
    assert load_error(tmp_path) == \
        "model.norm.weight: missing from model.safetensors.index.json weight_map (expected shape (8,))"


def test_missing_tensor_in_single_file(tmp_path, rng):
    tensors = random_checkpoint(tiny_config(), rng)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_error(tmp_path) == \
        "model.layers.1.mlp.down_proj.weight: missing from model.safetensors (expected shape (8, 12))"


def test_missing_tensor_in_a_shard(tmp_path, rng):
    tensors = random_checkpoint(tiny_config(), rng)
    write_sharded(tmp_path, tensors, shard_of=lambda n: 0)
    # The index claims model.norm.weight lives in shard 1, which does not hold it.
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load_error(tmp_path) == \
        "model.norm.weight: missing from model-00002-of-00002.safetensors (expected shape (8,))"


def test_wrong_shape(tmp_path, rng):
    tensors = random_checkpoint(tiny_config(), rng)
    tensors[K_PROJ] = rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_error(tmp_path) == f"{K_PROJ}: expected shape (4, 8), got (8, 8) in model.safetensors"


@pytest.mark.parametrize("dtype, name", [(np.float64, "F64"), (np.int32, "I32")])
def test_unsupported_dtype(tmp_path, rng, dtype, name):
    tensors = random_checkpoint(tiny_config(), rng)
    tensors[K_PROJ] = tensors[K_PROJ].astype(dtype)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_error(tmp_path) == \
        f"{K_PROJ}: unsupported dtype '{name}' in model.safetensors (expected BF16, F16 or F32)"


def test_header_length_beyond_file_size(tmp_path):
    (tmp_path / "model.safetensors").write_bytes((10_000).to_bytes(8, "little") + b'{"a": 1}')
    assert load_error(tmp_path) == \
        "model.safetensors: header length 10000 is beyond the file size (16 bytes)"


def test_file_too_short_for_a_header(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x02")
    assert load_error(tmp_path) == "model.safetensors: 2 bytes, too short for a safetensors header"


def test_header_not_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes((6).to_bytes(8, "little") + b"{oops}" + bytes(64))
    assert load_error(tmp_path).startswith("model.safetensors: header is not JSON (")


def test_truncated_file_names_the_tensor_past_the_end(tmp_path, rng):
    path = tmp_path / "model.safetensors"
    save_file(random_checkpoint(tiny_config(), rng), str(path))
    header, _ = read_header(path)
    last = max(header, key=lambda n: header[n]["data_offsets"][1] if n != "__metadata__" else -1)
    begin, end = header[last]["data_offsets"]
    path.write_bytes(path.read_bytes()[:-1])
    assert load_error(tmp_path) == (
        f"{last}: data_offsets [{begin}, {end}] are beyond the end of model.safetensors "
        f"(data region {end - 1} bytes); is the file truncated?")


def test_data_offsets_inconsistent_with_shape(tmp_path, rng):
    path = tmp_path / "model.safetensors"
    save_file(random_checkpoint(tiny_config(), rng), str(path))
    header, data = read_header(path)
    begin, end = header[K_PROJ]["data_offsets"]
    header[K_PROJ]["data_offsets"] = [begin, end - 2]
    write_raw(path, header, data)
    assert load_error(tmp_path) == (
        f"{K_PROJ}: data_offsets [{begin}, {end - 2}] in model.safetensors hold {end - 2 - begin} bytes, "
        f"but shape (4, 8) in BF16 needs 64")


def test_malformed_header_entry(tmp_path, rng):
    path = tmp_path / "model.safetensors"
    save_file(random_checkpoint(tiny_config(), rng), str(path))
    header, data = read_header(path)
    header[K_PROJ]["data_offsets"] = [-2, 62]
    write_raw(path, header, data)
    assert load_error(tmp_path).startswith(f"{K_PROJ}: malformed header entry in model.safetensors: ")


def test_model_dir_that_does_not_exist(tmp_path):
    assert load_error(tmp_path / "nope") == f"{tmp_path / 'nope'}: not a directory"
