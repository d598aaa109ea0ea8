"""A GGUF file's `tokenizer.ggml.*` metadata as a Hugging Face tokenizer.json + tokenizer_config.json.

Two vocabulary kinds, as llama.cpp names them in `tokenizer.ggml.model`:
- "gpt2": byte-level BPE. The tokens are already in GPT-2's byte alphabet and the merges are listed;
  `tokenizer.ggml.pre` names the pre-tokenizer, i.e. the regexes that split text before BPE (llama.cpp
  applies them in turn, each one splitting the pieces of the one before, and keeps unmatched stretches as
  pieces: a `Split(..., "isolated")` per regex).
- "llama": sentencepiece BPE. Tokens with scores and types (byte tokens <0x00>..<0xFF> for the fallback);
  no merges, so they are rebuilt from the scores (a pair merges with the priority of the token it makes,
  as sentencepiece picks the best-scoring pair). Spaces become "▁", with one in front of the text
  (`tokenizer.ggml.add_space_prefix`, and after each special token, as llama.cpp does).
Token type 3 (control: <|im_start|>, <s>, ...) becomes a special added token and type 4 (user-defined) a
plain added token, both with their own ids, so the vocabulary size stays the file's. bos/eos, add_bos_token
and the chat template go to tokenizer_config.json.
"""
from __future__ import annotations

from tinyvllm.errors import ModelLoadError
from tinyvllm.model.gguf.checkpoint import GGUFCheckpoint
from tinyvllm.model.llama3_tokenizer import LLAMA3_SPLIT_PATTERN

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# tokenizer.ggml.pre -> (the regexes llama.cpp splits with, ignore_merges: a word already in the vocabulary
# is one token without merging, as llama.cpp and Meta's tokenizer.json do for Llama 3)
PRE_TOKENIZERS = {
    "llama-bpe": ([LLAMA3_SPLIT_PATTERN], True),
    "llama3": ([LLAMA3_SPLIT_PATTERN], True),
    "llama-v3": ([LLAMA3_SPLIT_PATTERN], True),
    "smollm": ([r"\p{N}", GPT2_SPLIT], False),   # digits one by one, then GPT-2's split
    "starcoder": ([r"\p{N}", GPT2_SPLIT], False),
    "gpt-2": ([GPT2_SPLIT], False),
    "gpt2": ([GPT2_SPLIT], False),
}
# llama.cpp adds bos by default to sentencepiece vocabularies and to Llama 3's; the file's flag wins.
ADD_BOS_DEFAULT = {"llama": True, "llama-bpe": True, "llama3": True, "llama-v3": True}


def tokenizer_files(ckpt: GGUFCheckpoint) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) as dicts."""
    kind = ckpt.get("tokenizer.ggml.model", str)
    tokens = ckpt.get("tokenizer.ggml.tokens", list)
    types = ckpt.get("tokenizer.ggml.token_type", list, default=[NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.token_type has {len(types)} entries for "
                             f"{len(tokens)} tokens")

    def special_id(name: str) -> int | None:
        token_id = ckpt.get(f"tokenizer.ggml.{name}_token_id", int, default=None)
        if token_id is not None and not 0 <= token_id < len(tokens):
            raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.{name}_token_id {token_id} is outside the "
                                 f"{len(tokens)}-token vocabulary")
        return token_id

    ids = {name: special_id(name) for name in ("bos", "eos", "unknown", "padding")}
    if kind == "gpt2":
        pre = ckpt.get("tokenizer.ggml.pre", str, default="default")
        if pre not in PRE_TOKENIZERS:
            raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.pre {pre!r} is not supported "
                                 f"(supported: {', '.join(PRE_TOKENIZERS)})")
        model, normalizer, pre_tokenizer, decoder = _byte_level_parts(ckpt, tokens, pre)
        add_bos = ckpt.get("tokenizer.ggml.add_bos_token", bool, default=ADD_BOS_DEFAULT.get(pre, False))
    elif kind == "llama":
        add_space = ckpt.get("tokenizer.ggml.add_space_prefix", bool, default=True)
        unk = tokens[ids["unknown"]] if ids["unknown"] is not None else None
        model, normalizer, pre_tokenizer, decoder = _sentencepiece_parts(ckpt, tokens, types, unk, add_space)
        add_bos = ckpt.get("tokenizer.ggml.add_bos_token", bool, default=True)
    else:
        raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.model {kind!r} is not supported (supported: 'gpt2' "
                             f"byte-level BPE, 'llama' sentencepiece)")
    add_eos = ckpt.get("tokenizer.ggml.add_eos_token", bool, default=False)
    for name, flag in (("bos", add_bos), ("eos", add_eos)):
        if flag and ids[name] is None:
            raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.add_{name}_token is set but there is no "
                                 f"tokenizer.ggml.{name}_token_id")
    added = [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": token_type == CONTROL}
             for i, (token, token_type) in enumerate(zip(tokens, types)) if token_type in (CONTROL, USER_DEFINED)]
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(tokens, ids["bos"] if add_bos else None, ids["eos"] if add_eos else None),
        "decoder": decoder, "model": model,
    }

    def token(name: str) -> str | None:
        return tokens[ids[name]] if ids[name] is not None else None

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "bos_token": token("bos"), "eos_token": token("eos"), "unk_token": token("unknown"),
        "pad_token": token("padding"), "add_bos_token": add_bos, "add_eos_token": add_eos,
        "model_max_length": ckpt.get("llama.context_length", int, default=2048),
    }
    if ckpt.has("tokenizer.chat_template"):
        tokenizer_config["chat_template"] = ckpt.get("tokenizer.chat_template", str)
    return tokenizer_json, {k: v for k, v in tokenizer_config.items() if v is not None}


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)  # a repeated token keeps its first id, as llama.cpp's text -> id map does
    return vocab


def _byte_level_parts(ckpt: GGUFCheckpoint, tokens: list[str], pre: str):
    merges = ckpt.get("tokenizer.ggml.merges", list)
    pairs = []
    for n, merge in enumerate(merges):
        left, space, right = merge.partition(" ")
        if not space or not left or not right:
            raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.merges[{n}] is {merge!r}, expected 'left right'")
        pairs.append([left, right])
    splits, ignore_merges = PRE_TOKENIZERS[pre]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
             "vocab": _vocab(tokens), "merges": pairs}
    pre_tokenizer = {"type": "Sequence", "pretokenizers": [
        *({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False} for regex in splits),
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    decoder = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return model, None, pre_tokenizer, decoder


def _sentencepiece_parts(ckpt: GGUFCheckpoint, tokens: list[str], types: list[int], unk: str | None,
                         add_space: bool):
    scores = ckpt.get("tokenizer.ggml.scores", list)
    if len(scores) != len(tokens):
        raise ModelLoadError(f"{ckpt.path}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    vocab = _vocab(tokens)
    mergeable = {t for t, ty in zip(tokens, types) if ty in (NORMAL, USER_DEFINED)}
    candidates = []  # (-score of the merged token, its id, left, right)
    for i, (token, token_type, score) in enumerate(zip(tokens, types, scores)):
        if token_type != NORMAL or len(token) < 2:
            continue
        candidates += [(-score, i, token[:k], token[k:]) for k in range(1, len(token))
                       if token[:k] in mergeable and token[k:] in mergeable]
    candidates.sort()
    model = {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": vocab, "merges": [[left, right] for _, _, left, right in candidates]}
    space_to_meta = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, space_to_meta]}
                  if add_space else space_to_meta)
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]
    if add_space:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return model, normalizer, None, {"type": "Sequence", "decoders": decoders}


def _post_processor(tokens: list[str], bos_id: int | None, eos_id: int | None) -> dict | None:
    """Prepend bos / append eos when add_special_tokens (what add_bos_token / add_eos_token ask for)."""
    if bos_id is None and eos_id is None:
        return None
    specials = [(tokens[i], i) for i in (bos_id, eos_id) if i is not None]
    bos = [{"SpecialToken": {"id": tokens[bos_id], "type_id": 0}}] if bos_id is not None else []
    eos = [{"SpecialToken": {"id": tokens[eos_id], "type_id": 0}}] if eos_id is not None else []
    single = bos + [{"Sequence": {"id": "A", "type_id": 0}}] + eos
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {token: {"id": token, "ids": [i], "tokens": [token]} for token, i in specials}}
