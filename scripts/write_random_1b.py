"""Write the random Llama-3.2-1B-shaped model the GPU checks run on (seeded bf16 weights), unless already there.

    python scripts/write_random_1b.py [DIR] [--tokenizer-from MODEL.gguf]

The weights are tinyvllm.bench.prepare_random_model's. Its tokenizer is a placeholder (every word one token),
enough for speed. `--tokenizer-from` is for runs that need real words (the eval checks): Meta's Llama 3
tokenizer when llama-models imports, else the GGUF's (SmolLM2's ids fit the 128k vocabulary).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def write_tokenizer(out: Path, gguf: Path) -> None:
    from tinyvllm.model.gguf import GGUFModelFiles, find_gguf_file
    from tinyvllm.model.fixtures.random_model import write_llama3_tokenizer_if_available
    out.mkdir(parents=True, exist_ok=True)
    if (out / "tokenizer.json").is_file() or write_llama3_tokenizer_if_available(out, 128256) or not gguf.exists():
        return
    files = GGUFModelFiles.read(find_gguf_file(gguf))
    files.tokenizer()
    for name, obj in (("tokenizer.json", files.tokenizer_json), ("tokenizer_config.json", files.tokenizer_config)):
        (out / name).write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    print(f"random 1B: the tokenizer of {gguf}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", default="/tmp/llama-1b-random")
    parser.add_argument("--tokenizer-from", metavar="GGUF", help="a .gguf whose tokenizer to use if Llama 3's is "
                                                                 "not available")
    args = parser.parse_args()
    from tinyvllm.bench import prepare_random_model
    out = Path(args.model_dir)
    if args.tokenizer_from:
        write_tokenizer(out, Path(args.tokenizer_from))
    prepare_random_model(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
