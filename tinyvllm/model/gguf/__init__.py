"""GGUF checkpoints (llama.cpp's format) as tinyvllm models, beside the safetensors loader.

`tinyvllm.model.loader.load_model` calls `find_gguf_file` on the path it is given: a .gguf file, or a directory
without config.json holding exactly one .gguf, loads through here; anything else is a Hugging Face directory.
Everything in a GGUF becomes what a Hugging Face directory would hold, in memory: config.json
(`hf_config`), generation_config.json, tokenizer.json + tokenizer_config.json (`tokenizer_json`) and the
weights as bf16 with Hugging Face names and q/k row order (`checkpoint`). Above the loader nothing knows
which format a model came from; `tinyvllm convert` (`convert.py`) writes the same files to disk.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tinyvllm.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


def find_gguf_file(path: str | Path) -> Path | None:
    """The GGUF file `path` means, or None when it is (or should be) a Hugging Face model directory."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            is_gguf = f.read(4) == GGUF_MAGIC
        if is_gguf:
            return path
        if path.suffix.lower() == ".gguf":
            raise ModelLoadError(f"{path}: not a GGUF file (it does not start with {GGUF_MAGIC!r})")
        raise ModelLoadError(f"{path}: --model takes a model directory or a .gguf file")
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ModelLoadError(f"{path}: {len(found)} .gguf files ({', '.join(p.name for p in found)}); "
                                 f"pass the one to load")
        if found:
            return found[0]
    return None


@dataclass
class GGUFModelFiles:
    """The Hugging Face files a GGUF file amounts to, as dicts; `weights` reads the tensors."""
    checkpoint: object  # GGUFCheckpoint
    config: dict
    generation_config: dict
    tokenizer_json: dict
    tokenizer_config: dict

    @classmethod
    def read(cls, path: str | Path) -> "GGUFModelFiles":
        from tinyvllm.model.gguf.checkpoint import GGUFCheckpoint
        from tinyvllm.model.gguf.hf_config import generation_config_dict, hf_config_dict
        from tinyvllm.model.gguf.tokenizer_json import tokenizer_files
        ckpt = GGUFCheckpoint(path)
        tokenizer_json, tokenizer_config = tokenizer_files(ckpt)
        return cls(ckpt, hf_config_dict(ckpt), generation_config_dict(ckpt), tokenizer_json, tokenizer_config)

    @property
    def source(self) -> str:
        return f"{self.checkpoint.path} (GGUF metadata)"

    def model_config(self):
        from tinyvllm.model.config import ModelConfig
        return ModelConfig.from_dict(self.config, source=self.source)

    def generation_defaults(self):
        from tinyvllm.model.config import GenerationDefaults
        return GenerationDefaults.from_dict(self.generation_config, source=self.source)

    def tokenizer(self):
        import tokenizers

        from tinyvllm.model.tokenizer import Tokenizer
        try:
            backend = tokenizers.Tokenizer.from_str(json.dumps(self.tokenizer_json))
        except Exception as e:  # the library raises a plain Exception
            raise ModelLoadError(f"{self.source}: cannot build the tokenizer: {e}") from e
        c = self.tokenizer_config
        return Tokenizer(backend, c.get("chat_template"), c.get("bos_token"), c.get("eos_token"))

    def weights(self, config, progress=None, notices=None):
        from tinyvllm.model.weights import expected_tensor_shapes
        return self.checkpoint.load_weights(expected_tensor_shapes(config), config.num_attention_heads,
                                            config.num_key_value_heads, progress=progress, notices=notices)
