"""A model directory with seeded random BF16 weights, by default of the exact Llama-3.2-1B shape.

Real Llama weights cannot be downloaded here; for full-size correctness and speed checks the shape is
what matters. Linear and embedding weights are N(0, 0.02) as in HF's initialisation, norm weights
1 + N(0, 0.02) so the norms are exercised. Same seed, same bytes. `--dtype f32` stores the same draws as
F32, unrounded (an F32 checkpoint: tinyvllm then computes with float32 weights).

    python -m tinyvllm.model.random_model OUT_DIR [--seed 0] [--tokenizer-from DIR] [--layers N] [--dtype bf16|f32]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import expected_tensor_shapes

LLAMA_3_2_1B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-05,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}
LLAMA_3_2_1B_GENERATION_CONFIG = {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
                                  "do_sample": True, "temperature": 0.6, "top_p": 0.9}
INIT_STD = 0.02
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def random_weights(config: ModelConfig, seed: int = 0, dtype: str = "bf16") -> dict[str, np.ndarray]:
    """{name: ml_dtypes.bfloat16 array, or float32 with dtype "f32"}; tensor i is drawn from its own stream so
    the order never matters."""
    assert dtype in ("bf16", "f32"), dtype
    weights = {}
    for i, (name, shape) in enumerate(expected_tensor_shapes(config).items()):
        rng = np.random.default_rng([seed, i])
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
        if name.endswith("norm.weight"):
            values += np.float32(1.0)
        weights[name] = values.astype(ml_dtypes.bfloat16) if dtype == "bf16" else values
    return weights


def write_random_model(out_dir: str | Path, config_dict: dict | None = None, seed: int = 0,
                       tokenizer_from: str | Path | None = None, dtype: str = "bf16") -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_dict = dict(LLAMA_3_2_1B_CONFIG if config_dict is None else config_dict)
    config = ModelConfig.from_dict(config_dict)
    if dtype == "f32":
        config_dict["torch_dtype"] = "float32"
    (out_dir / "generation_config.json").write_text(
        json.dumps(LLAMA_3_2_1B_GENERATION_CONFIG, indent=2, sort_keys=True) + "\n")
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    save_file(random_weights(config, seed, dtype), str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "tinyvllm_random_seed": str(seed)})
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_from) / name
            if src.is_file():
                shutil.copyfile(src, out_dir / name)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, help="fewer layers than the 1B's 16 (quick checks)")
    parser.add_argument("--tokenizer-from", metavar="DIR", help="copy tokenizer files from this model dir")
    parser.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="stored weight dtype")
    args = parser.parse_args(argv)
    config = dict(LLAMA_3_2_1B_CONFIG)
    if args.layers:
        config["num_hidden_layers"] = args.layers
    out = write_random_model(args.out_dir, config, args.seed, args.tokenizer_from, args.dtype)
    size = (out / "model.safetensors").stat().st_size
    print(f"wrote {out} ({size / 1e9:.2f} GB of {args.dtype.upper()} weights, seed {args.seed})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
