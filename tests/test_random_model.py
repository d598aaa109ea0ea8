"""The seeded random models (tinyvllm/model/fixtures): same seed, same bytes, as the GPU comparisons rely on."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

from tests.references import missing_reference
import tinyvllm.model.fixtures.random_model as random_model
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.fixtures.random_model import LLAMA_3_2_1B_CONFIG, main, write_random_model
from tinyvllm.model.llama3_tokenizer import meta_tokenizer_model_path
from tinyvllm.model.fixtures.random_weights import hf_init, random_weights
from tinyvllm.model.weights import expected_tensor_shapes

ROOT = Path(__file__).resolve().parents[1]

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


def test_the_command_writes_meta_tokenizer_beside_the_weights(tmp_path, monkeypatch):
    """`python -m ...random_model DIR` must leave a directory the loader takes whole. The 1B's shape is shrunk to
    SMALL with Llama 3's vocabulary (the command's shape is the point elsewhere; 0.65 GB per layer is slow here)."""
    if meta_tokenizer_model_path() is None:
        missing_reference("Meta's Llama 3 tokenizer.model (pip install --no-deps llama-models==0.3.0)")
    from tinyvllm.model.loader import load_model
    monkeypatch.setattr(random_model, "LLAMA_3_2_1B_CONFIG", dict(SMALL, vocab_size=128256))
    assert main([str(tmp_path / "m")]) == 0
    model = load_model(tmp_path / "m", log=lambda message: None)
    assert model.tokenizer.vocab_size == model.config.vocab_size == 128256
    # Meta's own check in llama_models' tokenizer tests, after <|begin_of_text|>
    assert model.tokenizer.encode("This is a test sentence.") == [128000, 2028, 374, 264, 1296, 11914, 13]
    assert model.tokenizer.eos_token == "<|eot_id|>"


def test_without_llama_models_the_command_says_what_is_missing_before_writing(tmp_path):
    """A llama_models package without its tokenizer.model stands in for one not installed (the real one is found
    later on the path)."""
    fake = tmp_path / "site" / "llama_models"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "tinyvllm.model.fixtures.random_model", str(tmp_path / "m")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenizer.model" in lines[0] and "pip install --no-deps llama-models==0.3.0" in lines[0]
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_tokenizer_from_a_dir_without_tokenizer_json_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "m"), "--tokenizer-from", str(tmp_path / "empty")]) == 1
    assert "no tokenizer.json" in capsys.readouterr().err
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_generate_on_a_model_dir_without_tokenizer_names_the_missing_file(tmp_path):
    model_dir = write_random_model(tmp_path / "m", SMALL)  # weights and config only
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, "-m", "tinyvllm.cli", "generate", "--model", str(model_dir),
                           "--prompt", "hi"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{model_dir} has no tokenizer.json" in done.stderr
