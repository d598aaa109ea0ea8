"""Turning a model's numbers into answers: choice log-likelihoods, and answer letters parsed from text.

Loglikelihood: a choice's score is log P(its continuation tokens | prompt), summed over its tokens, as
lm-evaluation-harness computes it; the highest score wins (ties: the first, as np.argmax). The choices'
continuations form a trie over token ids: each internal node (a token prefix some continuations share) is
one next-token request, the prompt plus that prefix, asking for the log-probabilities of the tokens that may
follow it. Where every continuation is one token (" A" .. " D" in Llama 3's and SmolLM2's vocabularies)
the trie is its root alone: one request per question, max_tokens=1. Otherwise (the demo model's tiny
vocabulary splits " A" into " " + "A"; GPQA's " (A)") the deeper nodes run after the root, when the
prompt's KV blocks are in the prefix cache.

Generative: the letter is parsed from the model's text (the answer prefix included); text with no letter
counts as wrong and is reported as unparseable.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

OK, UNPARSEABLE, TOO_LONG, ERROR = "ok", "unparseable", "too_long", "error"


@dataclass
class ItemResult:
    """One question's outcome: a row of items.csv and of results.json's items."""
    task: str
    id: str
    subject: str
    answer: int
    status: str = OK                      # ok | unparseable (generative) | too_long | error
    prediction: int | None = None
    scores: list[float] | None = None     # loglikelihood: each choice's log-probability (nats)
    prompt_tokens: int = 0
    output_tokens: int = 0                # generative: tokens generated
    response: str | None = field(default=None)   # generative, MMLU only (GPQA text is never stored)
    error: str | None = None

    @property
    def correct(self) -> bool:
        return self.prediction is not None and self.prediction == self.answer

    @property
    def evaluated(self) -> bool:
        """Counted in the accuracy: scored or answered (unparseable answers count as wrong)."""
        return self.status in (OK, UNPARSEABLE)


class ContinuationTrie:
    """The choices' continuation token ids as a trie; `nodes` maps each internal node (a token prefix) to
    the ids that follow it in some continuation."""

    def __init__(self, continuations: list[tuple[int, ...]]):
        assert continuations and all(continuations), "every continuation needs at least one token"
        self.continuations = [tuple(c) for c in continuations]
        followers: dict[tuple[int, ...], set[int]] = {}
        for c in self.continuations:
            for k in range(len(c)):
                followers.setdefault(c[:k], set()).add(c[k])
        self.nodes = {prefix: tuple(sorted(ids)) for prefix, ids in followers.items()}

    @property
    def deeper_nodes(self) -> list[tuple[int, ...]]:
        return [prefix for prefix in self.nodes if prefix]

    def scores(self, node_logprobs: dict[tuple[int, ...], dict[int, float]]) -> list[float]:
        """Each continuation's summed log-probability from every node's next-token log-probabilities."""
        return [float(sum(node_logprobs[c[:k]][c[k]] for k in range(len(c)))) for c in self.continuations]


def best_choice(scores: list[float]) -> int:
    """The index of the highest score; the first of equal ones (np.argmax's rule)."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def top_two_margin(scores: list[float]) -> float:
    """How far the winning score is ahead of the runner-up (0 for a tie)."""
    ordered = sorted(scores, reverse=True)
    return ordered[0] - ordered[1]


# Parsing answers. The letter must be a capital A-D standing alone ("B", "(B)", "**B**", "B." ...), so words
# such as "A cat" or "Apple" never count. Patterns in order of trust; within one, the last match wins
# (models often restate the question's letters before concluding).
_LETTER = r"[\(\[\*\"'`]*\s*([ABCD])(?![A-Za-z0-9])"
_ANSWER_PATTERNS = [
    re.compile(r"(?i:best answer is)\s*[:\-]?\s*" + _LETTER),
    re.compile(r"(?i:answer)\s*(?:(?i:is)\s*)?[:\-]?\s*" + _LETTER),
    re.compile(r"^\s*" + _LETTER + r"[\)\]\*\"'`]*\s*[\.\):]?\s*$"),   # the whole text is the letter
    re.compile(r"^\s*[\(\[]?([ABCD])[\)\]\.:](?:\s|$)"),                 # "B. <choice text>", "(B) ..."
]


def parse_answer_letter(text: str) -> int | None:
    """The answer's index (A = 0) from a model's response, or None when no pattern finds one."""
    for pattern in _ANSWER_PATTERNS:
        matches = pattern.findall(text)
        if matches:
            return "ABCD".index(matches[-1])
    return None
