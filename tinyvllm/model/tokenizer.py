"""Text <-> token ids for a model directory, and chat messages -> prompt ids.

The `tokenizers` library runs the model's own tokenizer.json (normalizer, pre-tokenizer, BPE, post-processor
and added special tokens), so ids match transformers' fast tokenizer exactly. tokenizer_config.json supplies
the chat template and the bos/eos token strings, as in transformers.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import tokenizers

from tinyvllm.errors import ModelLoadError
from tinyvllm.model.chat_template import LLAMA32_CHAT_TEMPLATE, render_chat_template


@dataclass
class Tokenizer:
    backend: tokenizers.Tokenizer
    chat_template: str | None = None  # None: the model ships none, LLAMA32_CHAT_TEMPLATE is used
    bos_token: str | None = None
    eos_token: str | None = None

    @classmethod
    def from_model_dir(cls, path) -> "Tokenizer":
        path = Path(path)
        tokenizer_json = path / "tokenizer.json"
        if path.is_dir() and not tokenizer_json.exists():
            raise ModelLoadError(f"{path} has no tokenizer.json: a model directory needs its tokenizer files "
                                 "(tokenizer.json, tokenizer_config.json) beside config.json")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        except Exception as e:  # the library raises a plain Exception for a missing or malformed file
            raise ModelLoadError(f"cannot load tokenizer {tokenizer_json}: {e}") from e
        config = _read_json(path / "tokenizer_config.json")
        tokenizer = cls(backend, _chat_template(path, config), _token_string(config.get("bos_token")),
                        _token_string(config.get("eos_token")))
        for name in ("bos_token", "eos_token"):
            token = getattr(tokenizer, name)
            if token is not None and backend.token_to_id(token) is None:
                raise ModelLoadError(f"{path / 'tokenizer_config.json'}: {name} {token!r} is not in tokenizer.json")
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.backend.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    @property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (e.g. "<|eot_id|>"), or None if the vocabulary lacks it."""
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; add_special_tokens runs the post-processor (Llama 3: prepend <|begin_of_text|>).
        Special tokens written in the text are always matched whole."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **extra) -> str:
        """The prompt text for `messages`, via the model's chat template (Llama 3.2's if it has none)."""
        return render_chat_template(self.chat_template or LLAMA32_CHAT_TEMPLATE, messages,
                                    add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
                                    eos_token=self.eos_token or "", **extra)

    def encode_chat(self, messages, add_generation_prompt: bool = True, **extra) -> list[int]:
        # The template already writes the bos token, so no post-processor (transformers does the same).
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra)
        return self.encode(text, add_special_tokens=False)


def _read_json(path: Path) -> dict:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return config


def _chat_template(model_dir: Path, config: dict) -> str | None:
    """transformers' order: a chat_template.jinja file beside the config wins over config["chat_template"],
    which is a string or a list of {"name", "template"} (we take the one named "default")."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ModelLoadError(f"{model_dir / 'tokenizer_config.json'}: chat_template must be a string")
    return template


def _token_string(token) -> str | None:
    """bos/eos in tokenizer_config.json are a string, an AddedToken dict {"content": ...}, or null."""
    if isinstance(token, dict):
        return token.get("content")
    return token
