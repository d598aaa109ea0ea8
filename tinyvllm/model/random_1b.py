"""The seeded random Llama-3.2-1B-shaped model the GPU runs use, with a tokenizer for its vocabulary."""
from __future__ import annotations

import time
from pathlib import Path


def prepare_random_model(model_dir: Path, config_dict: dict | None = None, log=print) -> Path:
    """A seeded random model (Llama-3.2-1B-shaped by default) in model_dir, written only if missing, with a
    tokenizer: Meta's Llama 3 one when llama-models is installed (as scripts/gpu_compare.py builds it), else a
    placeholder word-level vocabulary of the right size (the benchmark feeds token ids, never text)."""
    from tinyvllm.model.random_model import LLAMA_3_2_1B_CONFIG, write_random_model
    config_dict = config_dict or LLAMA_3_2_1B_CONFIG
    if not (model_dir / "config.json").is_file() or not (model_dir / "model.safetensors").is_file():
        start = time.perf_counter()
        write_random_model(model_dir, config_dict, seed=0)
        log(f"wrote random weights to {model_dir} in {time.perf_counter() - start:.1f} s")
    if not (model_dir / "tokenizer.json").is_file():
        if not _write_llama3_tokenizer(model_dir, config_dict["vocab_size"]):
            write_placeholder_tokenizer(model_dir, config_dict["vocab_size"])
            log(f"wrote a placeholder {config_dict['vocab_size']}-token tokenizer to {model_dir}")
    return model_dir


def _write_llama3_tokenizer(model_dir: Path, vocab_size: int) -> bool:
    from tinyvllm.model.llama3_tokenizer import meta_tokenizer_model_path, write_llama3_tokenizer_files
    if vocab_size != 128256 or meta_tokenizer_model_path() is None:
        return False
    write_llama3_tokenizer_files(model_dir)
    return True


def write_placeholder_tokenizer(model_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    backend = Tokenizer(models.WordLevel({f"<t{i}>": i for i in range(vocab_size)}, unk_token="<t0>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text("{}\n")
