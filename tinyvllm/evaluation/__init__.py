"""`tinyvllm eval`: MMLU and GPQA-diamond accuracy, computed the way the reference harnesses compute it.

    tinyvllm eval [--model DIR] [--tasks mmlu,gpqa_diamond] [--mode loglikelihood|generative]
                  [--num-fewshot 0-5] [--limit N | --subset FILE] [--seed S] [--max-context 4096]
                  [--out DIR] [--base-url URL [--served-model NAME]] [engine options]

Modules, one job each: `tasks` (the shipped data: MMLU test + dev, GPQA diamond decrypted in memory,
choices shuffled per question id), `prompts` (lm-evaluation-harness's mmlu / gpqa prompts, Meta's chat
prompt), `subset` (reproducible stratified subsets), `scoring` (choice log-likelihoods through a token
trie, answer-letter parsing), `backends` (the engine through its logprobs API) and `remote` (any
OpenAI-compatible server), `runner` (prompts -> subset -> context cap -> backend -> per-question results),
`report` (accuracy with Wilson 95 % intervals, JSON / CSV / text), `histograms`, `progress`; the command
line is tinyvllm/cli/eval.py.
"""
from tinyvllm.evaluation.runner import EvalConfig, prepare_task, run_task, select
from tinyvllm.evaluation.scoring import ItemResult, parse_answer_letter
from tinyvllm.evaluation.tasks import TASKS, Question, load_gpqa_diamond, load_mmlu

__all__ = ["EvalConfig", "ItemResult", "Question", "TASKS", "load_gpqa_diamond", "load_mmlu",
           "parse_answer_letter", "prepare_task", "run_task", "select"]
