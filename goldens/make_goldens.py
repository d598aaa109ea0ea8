"""Write the golden file (docs/architecture.md, "Golden file format") from Hugging Face transformers.

    python goldens/make_goldens.py [--model DIR | --model FILE.gguf] [--out tinyvllm/goldens/demo.npz] [--max-new-tokens 8]

Prompts are tokenized by transformers' own tokenizer and chat template (date fixed), every stage is
captured from transformers' LlamaForCausalLM in float32, so nothing here comes from tinyvllm.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from goldens.hf_reference import capture_stages, greedy_continuation, load_hf_model, stage_names  # noqa: E402

DEMO_MODEL_DIR = REPO_ROOT / "tinyvllm" / "model" / "demo_model"
DEFAULT_OUT = REPO_ROOT / "tinyvllm" / "goldens" / "demo.npz"   # shipped in the package; goldens/demo.npz links to it
DATE_STRING = "26 Jul 2024"

# Each prompt is plain text (tokenized with BOS) or a chat (rendered by the model's chat template with
# the generation prompt). Kept short: the simulator replays every one of them in the tests.
PROMPTS = [
    {"text": "The sun rose slowly over the quiet town"},
    {"chat": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]},
    {"chat": [{"role": "user", "content": "Who are you?"}]},
]
# Greedy goldens are only meaningful if no step is a near-tie that float32 rounding in another
# implementation could flip; logits here are O(1..10) and implementations agree to ~1e-4.
MIN_TOP2_MARGIN = 1e-3


def weights_sha256(model_dir: Path) -> str:
    """sha256 over the model's safetensors files (sorted by name), or of the .gguf file, so goldens pin the
    exact weights."""
    digest = hashlib.sha256()
    for shard in [model_dir] if model_dir.is_file() else sorted(model_dir.glob("*.safetensors")):
        digest.update(shard.read_bytes())
    return digest.hexdigest()


def load_model_and_tokenizer(model_path: Path):
    """An HF model directory, or a .gguf file read by transformers' own GGUF loader (goldens/hf_gguf.py:
    weights rounded to bf16, as tinyvllm computes with them)."""
    if model_path.suffix == ".gguf":
        from goldens.hf_gguf import load_hf_gguf_model, load_hf_gguf_tokenizer
        return load_hf_gguf_model(model_path), load_hf_gguf_tokenizer(model_path)
    return load_hf_model(model_path), AutoTokenizer.from_pretrained(model_path)


def prompt_ids(tokenizer, prompt: dict) -> tuple[list[int], str]:
    if "chat" in prompt:
        text = tokenizer.apply_chat_template(prompt["chat"], tokenize=False, add_generation_prompt=True,
                                             date_string=DATE_STRING)
        return tokenizer(text, add_special_tokens=False)["input_ids"], text
    return tokenizer(prompt["text"])["input_ids"], prompt["text"]


def greedy_margins(model, input_ids: list[int], greedy: list[int]) -> list[float]:
    """top1 - top2 logit at each greedy step (one forward over prompt + continuation)."""
    ids = torch.tensor([input_ids + greedy], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0, len(input_ids) - 1: -1]
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def make_goldens(model_dir: Path, out: Path, max_new_tokens: int) -> None:
    model, tokenizer = load_model_and_tokenizer(model_dir)
    stages = stage_names(model.config.num_hidden_layers)
    arrays = {}
    texts = []
    for p, prompt in enumerate(PROMPTS):
        ids, text = prompt_ids(tokenizer, prompt)
        texts.append(text)
        captured = capture_stages(model, ids)
        assert list(captured) == stages, list(captured)
        greedy = greedy_continuation(model, ids, max_new_tokens)
        margin = min(greedy_margins(model, ids, greedy))
        assert margin > MIN_TOP2_MARGIN, f"prompt {p}: greedy near-tie (margin {margin:.2e}); pick another prompt"
        arrays[f"p{p}.input_ids"] = np.asarray(ids, dtype=np.int32)
        arrays.update({f"p{p}.{name}": value.astype(np.float32) for name, value in captured.items()})
        arrays[f"p{p}.greedy_ids"] = np.asarray(greedy, dtype=np.int32)
        print(f"p{p}: {len(ids)} prompt tokens, greedy {greedy} {tokenizer.decode(greedy)!r}, "
              f"min top-2 margin {margin:.3f}")
    meta = {
        "model": model_dir.name,
        "source": f"transformers {transformers.__version__} float32",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "tokenizers": tokenizers.__version__, "numpy": np.__version__},
        "prompts": texts,
        "chat": [p.get("chat") for p in PROMPTS],
        "date_string": DATE_STRING,
        "max_new_tokens": max_new_tokens,
        "stages": stages,
        "weights_sha256": weights_sha256(model_dir),
    }
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} ({out.stat().st_size:,} bytes, {len(arrays)} arrays)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEMO_MODEL_DIR)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    make_goldens(args.model, args.out, args.max_new_tokens)


if __name__ == "__main__":
    main()
