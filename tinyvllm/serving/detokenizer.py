"""Streamed token ids -> text deltas whose concatenation is the request's final text.

Decoding the whole output at every step costs O(length) per token, so, as vLLM and transformers'
TextStreamer do, each step decodes only a short window: the tokens since the last emitted text (plus the
ones before them, for context) and emits what the window adds. A window that ends inside a multi-byte
character decodes to U+FFFD: nothing is emitted until the character completes. While stop strings
are set, the last len(longest stop) - 1 characters are held back, since they may turn out to be the start
of a stop string that the engine cuts from the final text.
"""
from __future__ import annotations

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode, stop: tuple[str, ...] = ()):
        """`decode`: token ids -> text (the tokenizer's, special tokens skipped)."""
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0      # the window starts here (context for the tokens after read_offset)
        self._read_offset = 0        # text of ids[:read_offset] has been decoded
        self._text = ""              # decoded so far
        self.sent = ""               # handed out so far: a prefix of _text
        self._hold = max((len(s) for s in stop), default=1) - 1

    def add(self, new_ids: list[int]) -> str:
        """The text these new tokens add, as much of it as is safe to show now ("" if none)."""
        self._ids += new_ids
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset:])
        if len(window_text) > len(prefix_text) and not window_text.endswith(REPLACEMENT_CHAR):
            self._text += window_text[len(prefix_text):]
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        safe = len(self._text) - self._hold
        if safe <= len(self.sent):
            return ""
        delta = self._text[len(self.sent):safe]
        self.sent += delta
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` (the engine's whole output text) after what was sent. What was sent is
        a prefix of it: a stop string the engine found at the last token starts at or after
        len(text before it) - (len(stop) - 1), which is where the held-back characters begin."""
        delta = final_text[len(self.sent):] if final_text.startswith(self.sent) else ""
        self.sent += delta
        return delta
