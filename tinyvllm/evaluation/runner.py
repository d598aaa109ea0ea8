"""One evaluation run: the prompts it needs, the subset, the context cap, the backend, the results.

    prepare_task(task, config, tokenizer) -> PreparedTask     the prompts and lengths the selection and run need
    run_task(prepared, config, backend)   -> TaskRun          the selected questions scored, one ItemResult each

A prompt that does not fit the context cap (`max_context`: prompt + longest continuation, or prompt +
max_gen_tokens) is not run: its item gets status too_long and is listed in the report.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.backends import Failure, GenerationJob, LoglikelihoodJob
from tinyvllm.evaluation.progress import Progress
from tinyvllm.evaluation.prompts import ANSWER_PREFIX, chat_messages, loglikelihood_prompt
from tinyvllm.evaluation.scoring import ERROR, OK, TOO_LONG, UNPARSEABLE, ItemResult, best_choice, parse_answer_letter
from tinyvllm.evaluation.subset import read_subset, sampled_subjects, select_subset, stratified_sample
from tinyvllm.evaluation.tasks import GPQA_ORDERS, TASKS, Question, load_gpqa_diamond, mmlu_dev_by_subject

MODES = ("loglikelihood", "generative")
MAX_FEWSHOT = 5  # MMLU's dev split has five questions per subject


@dataclass
class EvalConfig:
    tasks: tuple[str, ...] = ("mmlu",)
    mode: str = "loglikelihood"
    num_fewshot: int = 0
    limit: int | None = None              # a stratified subset of this many questions per task
    subset: str | None = None             # or exactly the questions named in this file
    seed: int = 0
    max_context: int = 4096               # prompt + continuation (or + max_gen_tokens) must fit
    max_gen_tokens: int = 16
    answer_prefix: str = ANSWER_PREFIX    # generative: begins the assistant's answer
    add_special_tokens: bool = True       # loglikelihood prompts get the tokenizer's BOS (as a served text prompt)
    gpqa_order: str = "tinyvllm"          # GPQA's choice order: tasks.GPQA_ORDERS ("lm-eval": as gpqa_diamond_zeroshot)

    def __post_init__(self):
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise TinyVLLMError(f"eval: {message}")
        unknown = sorted(set(self.tasks) - set(TASKS))
        check(self.tasks and not unknown, f"unknown task(s) {unknown}; choose from {', '.join(TASKS)}")
        check(self.mode in MODES, f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        check(0 <= self.num_fewshot <= MAX_FEWSHOT, f"--num-fewshot must be in [0, {MAX_FEWSHOT}], got {self.num_fewshot}")
        check(self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}")
        check(not (self.limit and self.subset), "give --limit or --subset, not both")
        check(self.max_context >= 2, f"--max-context must be >= 2, got {self.max_context}")
        check(self.max_gen_tokens >= 1, f"--max-gen-tokens must be >= 1, got {self.max_gen_tokens}")
        check(self.gpqa_order in GPQA_ORDERS, f"--gpqa-order must be one of {', '.join(GPQA_ORDERS)}, got {self.gpqa_order!r}")

    @property
    def stop(self) -> tuple[str, ...]:
        """With an answer prefix the letter comes at once: stop at the first period (lm-eval's llama3 task)."""
        return (".",) if self.answer_prefix else ()


@dataclass
class PreparedTask:
    task: str
    questions: list[Question]
    # per question, None where the run does not read it (runner.questions_to_tokenize)
    texts: list[str | None]                # the prompt as text (generative: rendered chat + answer prefix)
    prompt_ids: list[list[int] | None]
    continuations: tuple[str, ...] = ()    # loglikelihood
    messages: list[list[dict] | None] = field(default_factory=list)  # generative
    num_fewshot: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def lengths(self) -> list[int | None]:
        return [None if ids is None else len(ids) for ids in self.prompt_ids]


@dataclass
class TaskRun:
    prepared: PreparedTask
    selected: list[int]                    # indices into prepared.questions
    results: list[ItemResult]              # one per selected question, in order
    seconds: float                         # the backend's wall time
    backend_stats: dict


def prepare_task(task: str, config: EvalConfig, tokenizer) -> PreparedTask:
    """Every question, and the prompts (text and ids) of those `select` and `run_task` read
    (`questions_to_tokenize`); the others' prompt fields are None."""
    questions = load_gpqa_diamond(order=config.gpqa_order) if task == "gpqa_diamond" else TASKS[task]()
    notes = []
    k = config.num_fewshot if task == "mmlu" else 0
    if config.num_fewshot and task != "mmlu":
        notes.append(f"{task} has no few-shot split: run 0-shot")
    wanted = questions_to_tokenize(task, questions, config)
    if len(wanted) < len(questions):
        notes.append(f"prompt lengths of {len(wanted)} of {len(questions)} questions measured: "
                     + ("those of the subjects the --limit sample draws from" if config.limit else "the --subset's"))
    dev = mmlu_dev_by_subject() if k else {}
    shots = {i: dev.get(questions[i].subject, [])[:k] for i in wanted}
    generative = config.mode == "generative"
    texts: list[str | None] = [None] * len(questions)
    messages: list[list[dict] | None] = [None] * len(questions)
    continuations = ()
    for i in wanted:
        if generative:
            messages[i] = chat_messages(questions[i], shots[i])
            texts[i] = tokenizer.apply_chat_template(messages[i]) + config.answer_prefix
        else:
            texts[i], continuations = loglikelihood_prompt(questions[i], shots[i])
    # a chat template writes its special tokens itself
    ids = _encode_batch(tokenizer, [texts[i] for i in wanted], config.add_special_tokens and not generative)
    prompt_ids: list[list[int] | None] = [None] * len(questions)
    for i, row in zip(wanted, ids):
        prompt_ids[i] = row
    return PreparedTask(task, questions, texts, prompt_ids, continuations, messages if generative else [],
                        num_fewshot=k, notes=notes)


def questions_to_tokenize(task: str, questions: list[Question], config: EvalConfig) -> list[int]:
    """Indices (ascending) of the questions whose prompts the run reads: with --limit every question of the
    subjects the sample draws from (it orders each one's questions by prompt length), with --subset the named
    ones, else all. Tokenizing only these keeps `--limit 8` from tokenizing all of MMLU first."""
    if config.limit:
        subjects = sampled_subjects([q.subject for q in questions], config.limit, config.seed)
        return [i for i, q in enumerate(questions) if q.subject in subjects]
    if config.subset:
        entries = set(read_subset(config.subset))  # bare ids or task:id, as select_subset reads them
        return [i for i, q in enumerate(questions) if q.id in entries or f"{task}:{q.id}" in entries]
    return list(range(len(questions)))


def select(prepared: list[PreparedTask], config: EvalConfig) -> dict[str, list[int]]:
    """Per task, the indices of the questions to run: all, a stratified --limit sample, or a --subset."""
    if config.subset:
        ids = {p.task: [q.id for q in p.questions] for p in prepared}
        return select_subset(read_subset(config.subset), ids, config.subset)
    if config.limit:
        return {p.task: stratified_sample([q.subject for q in p.questions], p.lengths, config.limit, config.seed)
                for p in prepared}
    return {p.task: list(range(len(p.questions))) for p in prepared}


def run_task(prepared: PreparedTask, selected: list[int], config: EvalConfig, backend, tokenizer,
             estimate_s: float | None = None) -> TaskRun:
    """Run the selected questions; `estimate_s` (the simulator's up-front estimate) shapes the progress line's
    time left."""
    results = [ItemResult(q.task, q.id, q.subject, q.answer, prompt_tokens=len(prepared.prompt_ids[i]))
               for i in selected for q in [prepared.questions[i]]]
    generative = config.mode == "generative"
    if generative:
        needs = [config.max_gen_tokens] * len(selected)
        conts = None
    else:
        conts = continuation_ids(tokenizer, [prepared.texts[i] for i in selected],
                                 [prepared.prompt_ids[i] for i in selected], prepared.continuations,
                                 config.add_special_tokens)
        needs = [max(map(len, c)) for c in conts]
    runnable = []
    for row, (result, need) in enumerate(zip(results, needs)):
        if result.prompt_tokens + need > config.max_context:
            result.status = TOO_LONG
        else:
            runnable.append(row)
    progress = Progress(len(runnable), f"{prepared.task} ({config.mode}, {prepared.num_fewshot}-shot)",
                        estimate_s=estimate_s)

    def on_done(j: int, outcome) -> None:
        result = results[runnable[j]]
        if isinstance(outcome, Failure):
            result.status, result.error = ERROR, outcome.message
        elif generative:
            text = config.answer_prefix + outcome.text
            result.prediction = parse_answer_letter(text)
            result.status = OK if result.prediction is not None else UNPARSEABLE
            result.output_tokens = outcome.output_tokens
            result.response = text if prepared.task == "mmlu" else None
        else:
            result.scores, result.prediction = outcome, best_choice(outcome)
        progress.advance(1, result.prompt_tokens)

    start = time.perf_counter()
    try:
        if generative:
            jobs = [GenerationJob(prepared.prompt_ids[selected[r]], prepared.messages[selected[r]],
                                  config.answer_prefix) for r in runnable]
            backend.generate(jobs, config.max_gen_tokens, config.stop, on_done)
        else:
            backend.loglikelihoods([LoglikelihoodJob(prepared.prompt_ids[selected[r]], conts[r]) for r in runnable],
                                   on_done)
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    return TaskRun(prepared, selected, results, seconds, backend.stats())


def continuation_ids(tokenizer, texts: list[str], prompt_ids: list[list[int]], continuations: tuple[str, ...],
                     add_special_tokens: bool) -> list[list[tuple[int, ...]]]:
    """Each prompt's continuations as the token ids that follow the prompt's own tokens: the encoding of
    prompt + continuation minus the prompt's (lm-eval's context/continuation split). Where the two encodings
    do not share the prompt's tokens (a merge across the boundary), the continuation's own encoding is used."""
    wholes = _encode_batch(tokenizer, [t + c for t in texts for c in continuations], add_special_tokens)
    alone = [tuple(tokenizer.encode(c, add_special_tokens=False)) for c in continuations]
    out = []
    for i, ids in enumerate(prompt_ids):
        row = []
        for k in range(len(continuations)):
            whole = wholes[i * len(continuations) + k]
            follows = whole[:len(ids)] == ids and len(whole) > len(ids)
            row.append(tuple(whole[len(ids):]) if follows else alone[k])
        out.append(row)
    return out


def _encode_batch(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
    return [tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]
