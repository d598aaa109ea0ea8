"""Log-probabilities in OpenAI's two shapes, from the engine's per-token dicts ({token id: logprob}).

Each engine dict holds the chosen token's logprob and the top-n (plus any extra ids asked for), so the
n largest entries of a dict are exactly its top-n. Completions (the legacy shape that
lm-evaluation-harness reads): parallel lists tokens / token_logprobs / top_logprobs / text_offset, with
the prompt's tokens first when echo is set (the first prompt token has no logprob: None). Chat: one
{"token", "logprob", "bytes", "top_logprobs"} per output token.
"""
from __future__ import annotations

from tinyvllm.serving.protocol import ChatChoiceLogprobs, ChatLogprob, CompletionLogprobs, TopLogprob


def sampling_fields(top_n: int | None, with_prompt: bool = False) -> dict:
    """The SamplingParams fields that ask the engine for `top_n` logprobs per output token (and per
    prompt token with `with_prompt`); {} when top_n is None."""
    if top_n is None:
        return {}
    return {"logprobs": top_n, "prompt_logprobs": top_n if with_prompt else None}


def _top(entry: dict[int, float], n: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: -kv[1])[:n]


class TokenText:
    """A token id's own text (special tokens included), cached: logprobs name many tokens many times."""

    def __init__(self, decode):
        self._decode = decode
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._decode([token_id], skip_special_tokens=False)
        return text


def completion_logprobs(token_ids: list[int], entries: list[dict[int, float] | None], top_n: int,
                        token_text: TokenText, offset: int = 0) -> CompletionLogprobs:
    """`entries[i]` belongs to token_ids[i] (None: no logprob, the first prompt token); text offsets start
    at `offset` (the length of the text before these tokens)."""
    assert len(token_ids) == len(entries), (len(token_ids), len(entries))
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        text = token_text(token_id)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            out.token_logprobs.append(entry[token_id])
            out.top_logprobs.append({token_text(t): lp for t, lp in _top(entry, top_n)})
    return out


def chat_logprobs(token_ids: list[int], entries: list[dict[int, float]], top_n: int,
                  token_text: TokenText) -> ChatChoiceLogprobs:
    assert len(token_ids) == len(entries), (len(token_ids), len(entries))

    def top_logprob(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return dict(token=text, logprob=logprob, bytes=list(text.encode("utf-8", errors="replace")))

    return ChatChoiceLogprobs(content=[
        ChatLogprob(**top_logprob(t, entry[t]), top_logprobs=[TopLogprob(**top_logprob(i, lp)) for i, lp in _top(entry, top_n)])
        for t, entry in zip(token_ids, entries)])
