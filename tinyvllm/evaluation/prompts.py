"""Prompts, written exactly as the reference harnesses write them.

Loglikelihood (lm-evaluation-harness's `mmlu` and `gpqa_diamond_zeroshot` tasks): a text prompt ending in
"Answer:"; each choice is a continuation (" A" .. " D", or " (A)" .. " (D)" for GPQA) whose log-probability
after the prompt is its score. lm-eval's MMLU task always starts with the subject's description, 0-shot
too, then the `num_fewshot` first dev examples of the subject, each answered and followed by a blank line:

    The following are multiple choice questions (with answers) about abstract algebra.

    <question>           (shots: "<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer: B\\n\\n" first)
    A. ..
    B. ..
    C. ..
    D. ..
    Answer:

GPQA (lm-eval's gpqa zeroshot template, its choice clean-up: strip, " [title]" -> ". ", double spaces):

    What is the correct answer to this question:<question>
    Choices:
    (A) ..
    ...
    Answer:

Generative (Meta's Llama 3 instruct evaluation, as lm-eval's llama3 `mmlu` instruct task): one user turn
through the model's chat template, the assistant's answer begun with "The best answer is"; few-shot
examples are earlier user / assistant turns answered "The best answer is B.".
"""
from __future__ import annotations

from tinyvllm.evaluation.tasks import LETTERS, Question

MMLU_CONTINUATIONS = tuple(f" {letter}" for letter in LETTERS)
GPQA_CONTINUATIONS = tuple(f" ({letter})" for letter in LETTERS)
ANSWER_PREFIX = "The best answer is"


def mmlu_description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def mmlu_question(q: Question) -> str:
    """lm-eval's doc_to_text: the question stripped, the choices as they are."""
    options = "".join(f"\n{letter}. {choice}" for letter, choice in zip(LETTERS, q.choices))
    return f"{q.question.strip()}{options}\nAnswer:"


def mmlu_prompt(q: Question, shots: list[Question] = ()) -> str:
    """The description, each shot answered (" B") and followed by a blank line, then the question."""
    examples = "".join(f"{mmlu_question(s)} {s.answer_letter}\n\n" for s in shots)
    return mmlu_description(q.subject) + examples + mmlu_question(q)


def gpqa_prompt(q: Question) -> str:
    options = "".join(f"\n({letter}) {_gpqa_clean(choice)}" for letter, choice in zip(LETTERS, q.choices))
    return f"What is the correct answer to this question:{q.question}\nChoices:{options}\nAnswer:"


def _gpqa_clean(text: str) -> str:
    return text.strip().replace(" [title]", ". ").replace("  ", " ")


def loglikelihood_prompt(q: Question, shots: list[Question] = ()) -> tuple[str, tuple[str, ...]]:
    """(prompt text, the choices' continuation strings) for scoring by log-likelihood."""
    if q.task == "mmlu":
        return mmlu_prompt(q, shots), MMLU_CONTINUATIONS
    assert q.task == "gpqa_diamond" and not shots, (q.task, len(shots))
    return gpqa_prompt(q), GPQA_CONTINUATIONS


def chat_question(q: Question) -> str:
    """The user turn of the generative prompt (lm-eval's llama3 instruct mmlu doc_to_text)."""
    options = "".join(f"\n{letter}. {choice}" for letter, choice in zip(LETTERS, q.choices))
    return ("Given the following question and four candidate answers (A, B, C and D), choose the best answer.\n"
            f"{q.question.strip()}{options}\n"
            'Your response should end with "The best answer is [the_answer_letter]" where the '
            "[the_answer_letter] is one of A, B, C or D.")


def chat_messages(q: Question, shots: list[Question] = ()) -> list[dict[str, str]]:
    """The conversation for generative scoring; the assistant prefix is added after the chat template's
    generation prompt (see `ANSWER_PREFIX`)."""
    messages = []
    for s in shots:
        messages += [{"role": "user", "content": chat_question(s)},
                     {"role": "assistant", "content": f"{ANSWER_PREFIX} {s.answer_letter}."}]
    return messages + [{"role": "user", "content": chat_question(q)}]
