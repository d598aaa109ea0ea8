"""The seeded random models (tinyvllm/model/fixtures): same seed, same bytes, as the GPU comparisons rely on."""
import hashlib
import json

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.fixtures.random_model import LLAMA_3_2_1B_CONFIG, write_random_model
from tinyvllm.model.fixtures.random_weights import hf_init, random_weights
from tinyvllm.model.weights import expected_tensor_shapes

SMALL = dict(LLAMA_3_2_1B_CONFIG, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32)
# sha256 over (name, bytes) of every tensor of SMALL with hf_init(0); any change to the draws changes the
# random 1B model the GPU comparisons were run on.
SMALL_SHA256 = {"bf16": "c03065f0b03c8d57957206df57f7a72b080d29777d66de12d8dc2a3f860fb4dd",
                "f32": "1e9eef307779e27da9b0c104301d2b778093ae45075148cf5d0cdee79a2fff51"}


def _sha256(weights: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name, values in weights.items():
        digest.update(name.encode())
        digest.update(values.tobytes())
    return digest.hexdigest()


def test_hf_init_weights_are_the_pinned_bytes():
    config = ModelConfig.from_dict(SMALL)
    for dtype, expected in SMALL_SHA256.items():
        weights = random_weights(config, hf_init(0), dtype)
        assert list(weights) == list(expected_tensor_shapes(config))
        assert _sha256(weights) == expected, dtype


def test_bf16_weights_are_the_f32_draws_rounded_and_norms_start_at_one():
    config = ModelConfig.from_dict(SMALL)
    f32 = random_weights(config, hf_init(3), "f32")
    bf16 = random_weights(config, hf_init(3), "bf16")
    for name, values in f32.items():
        assert values.dtype == np.float32 and bf16[name].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(bf16[name], values.astype(ml_dtypes.bfloat16))
    assert abs(float(f32["model.norm.weight"].mean()) - 1.0) < 0.01
    assert abs(float(f32["model.embed_tokens.weight"].std()) - 0.02) < 0.001


def test_write_random_model_stores_the_draws_and_the_dtype(tmp_path):
    out = write_random_model(tmp_path / "f32", SMALL, seed=0, dtype="f32")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    stored = load_file(str(out / "model.safetensors"))
    assert _sha256({name: stored[name] for name in expected_tensor_shapes(ModelConfig.from_dict(SMALL))}) == \
        SMALL_SHA256["f32"]
