"""`tinyvllm convert IN.gguf OUT_DIR`: a GGUF model as a Hugging Face Llama directory.

Writes config.json, generation_config.json, model.safetensors (the weights exactly as tinyvllm loads them
from the GGUF, with q/k in Hugging Face's row order: bf16 for a quantized file, float32 for one with F32/F16
tensors and nothing quantized), tokenizer.json and
tokenizer_config.json (with the chat template). Every other command, HF transformers and
goldens/make_goldens.py can then use OUT_DIR.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from tinyvllm.errors import TinyVLLMError
from tinyvllm.model.gguf import GGUFModelFiles, find_gguf_file


def convert(gguf_path: str | Path, out_dir: str | Path, log=print, force: bool = False) -> list[Path]:
    """Write the HF directory for `gguf_path` (a .gguf file or a directory holding one) into out_dir. An
    existing out_dir must be empty unless `force`: then the files written here replace theirs there."""
    if not Path(gguf_path).exists():
        raise TinyVLLMError(f"no such file or directory: {gguf_path}")
    gguf_file = find_gguf_file(gguf_path)
    if gguf_file is None:
        raise TinyVLLMError(f"{gguf_path}: no GGUF file there")
    out_dir = Path(out_dir)
    if out_dir.resolve() == gguf_file.parent.resolve():
        raise TinyVLLMError(f"{out_dir}: write the converted model to a directory other than the GGUF file's")
    if out_dir.exists() and not out_dir.is_dir():
        raise TinyVLLMError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise TinyVLLMError(f"{out_dir}: the directory exists and is not empty (--force writes into it, replacing "
                            f"the files convert writes)")
    start = time.perf_counter()
    files = GGUFModelFiles.read(gguf_file)
    config = files.model_config()  # validates the metadata before anything is written
    files.tokenizer()
    notices: list[str] = []
    weights = files.weights(config, notices=notices)
    for notice in notices:
        log(f"note: {notice}")
    float32 = next(iter(weights.values())).dtype == np.float32
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    hf_config = {**files.config, "torch_dtype": "float32" if float32 else "bfloat16"}
    for name, obj in (("config.json", hf_config), ("generation_config.json", files.generation_config),
                      ("tokenizer.json", files.tokenizer_json), ("tokenizer_config.json", files.tokenizer_config)):
        path = out_dir / name
        path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    path = out_dir / "model.safetensors"
    save_file({name: w if float32 else w.view(ml_dtypes.bfloat16) for name, w in weights.items()}, str(path),
              metadata={"format": "pt", "source": gguf_file.name})
    # safetensors creates its file with mode 0600; give it the mode the JSON files got (0666 less the umask).
    os.chmod(path, written[0].stat().st_mode & 0o777)
    written.append(path)
    log(f"wrote {out_dir} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
        f"{config.vocab_size}) in {time.perf_counter() - start:.1f} s")
    return written
