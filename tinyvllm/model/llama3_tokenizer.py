"""Llama 3's tokenizer: its pre-tokenizer regex, its 256 special tokens, and a Hugging Face tokenizer.json
built from Meta's tiktoken file (tokenizer.model, shipped by the `llama-models` package).

Meta's tokenizer.model holds one "base64(token bytes) rank" line per regular token; ids are the ranks.
A HF byte-level BPE needs two more things that file does not state:
- each byte spelled as a printable unicode character (GPT-2's byte-to-unicode table), and
- a merge list. tiktoken merges, at every step, the adjacent pair whose concatenation has the lowest rank.
  We reproduce that rule (as transformers' TikTokenConverter does) by emitting, for every token, each split
  into two pieces that are themselves tokens, ordered by the rank of the whole token. With ignore_merges a
  pre-tokenized piece that is already a token maps to it directly, as tiktoken does.
This gives the tests and the random Llama-3.2-1B-shaped model the real vocabulary without a download or a
gated Hugging Face repo.
"""
from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from tinyvllm.model.chat_template import LLAMA32_CHAT_TEMPLATE

# The regex Llama 3 splits text with before BPE (tokenizer.json's pre_tokenizer, llama.cpp's "llama-bpe").
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3.x's 256 special tokens in published order (meta-llama/Llama-3.2-1B-Instruct tokenizer.json),
# with ids right after the regular vocabulary: offsets 0..10 are named or reserved 0-2, 11..255 reserved 3..247.
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
] + [f"<|reserved_special_token_{n}|>" for n in range(3, 248)]
assert len(LLAMA3_SPECIAL_TOKENS) == 256
BOS_TOKEN = "<|begin_of_text|>"


def meta_tokenizer_model_path() -> Path | None:
    """Meta's Llama 3 tokenizer.model inside the installed `llama-models` package, or None without it.
    Found without importing the package (its modules import tiktoken, which is not needed here)."""
    spec = importlib.util.find_spec("llama_models")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "llama3" / "tokenizer.model"
    return path if path.is_file() else None


def read_tiktoken_ranks(path) -> dict[bytes, int]:
    ranks = {}
    for line in Path(path).read_text().splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks must be the ids 0..n-1"
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the other 68 map to chr(256 + k) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + k) for k, b in enumerate(others)})
    return table


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of every token into two tokens, lowest whole-token rank first (ties: lower left, right rank)."""
    keyed = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                keyed.append((rank, ranks[left], ranks[right], left, right))
    keyed.sort(key=lambda k: k[:3])
    return [(left, right) for _, _, _, left, right in keyed]


def build_llama3_tokenizer(tiktoken_path=None) -> Tokenizer:
    tiktoken_path = tiktoken_path or meta_tokenizer_model_path()
    assert tiktoken_path is not None, "llama-models is not installed: no Llama 3 tokenizer.model"
    ranks = read_tiktoken_ranks(tiktoken_path)
    to_unicode = byte_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [(spell(left), spell(right)) for left, right in merges_from_ranks(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in LLAMA3_SPECIAL_TOKENS])
    bos_id = len(ranks)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1", special_tokens=[(BOS_TOKEN, bos_id)])
    special_ids = [tokenizer.token_to_id(name) for name in LLAMA3_SPECIAL_TOKENS]
    assert special_ids == list(range(bos_id, bos_id + len(LLAMA3_SPECIAL_TOKENS)))
    return tokenizer


def build_llama3_tokenizer_json(out_path) -> Path:
    """Write the Llama 3 tokenizer.json to out_path and return the path."""
    out_path = Path(out_path)
    build_llama3_tokenizer().save(str(out_path))
    return out_path


def write_llama3_tokenizer_files(model_dir) -> Path:
    """tokenizer.json built from Meta's file, and the Instruct model's tokenizer_config.json essentials
    (bos, eos, chat template), written into model_dir."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    build_llama3_tokenizer_json(model_dir / "tokenizer.json")
    config = {"bos_token": BOS_TOKEN, "eos_token": "<|eot_id|>", "chat_template": LLAMA32_CHAT_TEMPLATE}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir
