"""lm-evaluation-harness as a real client of `tinyvllm serve`: same questions, same answers.

1. `tinyvllm eval` (in-process engine, 0-shot loglikelihood, --no-special-tokens: lm-eval adds no BOS) scores a
   stratified --limit of MMLU and writes OUT/tinyvllm/results.json.
2. Those questions become a local lm-eval task read from disk (no hub access): OUT/lm_eval_task/tinyvllm_mmlu.yaml
   and test.jsonl, lm-eval's own `mmlu` template (doc_to_text, choices " A".." D") with the subject description
   rendered per question, since one task holds every subject.
3. `tinyvllm serve --model DIR --port P` starts, and
   `lm_eval --model local-completions --model_args model=...,base_url=http://127.0.0.1:P/v1/completions,
   tokenizer=DIR,tokenized_requests=True --tasks tinyvllm_mmlu --include_path OUT/lm_eval_task --log_samples`
   scores them through HTTP (/v1/completions with token-id prompts, echo, logprobs=1).
4. Accuracies and each question's choice log-likelihoods are compared. PASS: every question scored by both, every
   choice's log-likelihood within --score-tol, the same answer except where lm-eval's top two are within --margin
   nats, and lm-eval's own reported accuracy equal to tinyvllm eval's up to those near ties. The same engine
   runs both sides, but not the same batches: in the simulator the scores are equal (the default 1e-4 is loose);
   on a GPU a step's kernels depend on its size (GEMV or GEMM, tiles), so float32 sums round differently and
   scripts/lm_eval_gpu.sh uses eval_compare_hf.py's bounds (--score-tol 2e-2, --margin 5e-3). Writes
   OUT/lm_eval_check.json.

Needs `pip install "lm-eval[api]"` (datasets, tenacity, aiohttp) and `tinyvllm serve`; --model must be an HF directory
(lm-eval loads its tokenizer with transformers; `tinyvllm convert` a GGUF first).

    python scripts/lm_eval_check.py --model DIR [--limit 200] [--out out/lm-eval-check]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK = "tinyvllm_mmlu"
MMLU_TEMPLATE = {  # lm-eval's lm_eval/tasks/mmlu/default/_default_template_yaml, with the description per doc
    "description": "The following are multiple choice questions (with answers) about {{subject.replace('_', ' ')}}.\n\n",
    "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:",
}


def write_lm_eval_task(questions, out_dir: Path) -> Path:
    """The local task for these MMLU questions: test.jsonl (id, subject, question, choices, answer index) and
    the task yaml; returns the yaml's path. Values are written as JSON strings, which YAML reads as is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "test.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for q in questions:
            f.write(json.dumps({"id": q.id, "subject": q.subject, "question": q.question,
                                "choices": list(q.choices), "answer": q.answer}) + "\n")
    lines = [f"task: {TASK}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
             f"    test: {json.dumps(str(data.resolve()))}", "test_split: test", "output_type: multiple_choice",
             f"description: {json.dumps(MMLU_TEMPLATE['description'])}",
             f"doc_to_text: {json.dumps(MMLU_TEMPLATE['doc_to_text'])}",
             'doc_to_choice: ["A", "B", "C", "D"]', "doc_to_target: answer",
             "metric_list:", "  - metric: acc", "    aggregation: mean", "    higher_is_better: true",
             "metadata:", "  version: 1.0"]
    path = out_dir / f"{TASK}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def lm_eval_samples(output_path: Path) -> dict[str, list[float]]:
    """{question id: per-choice log-likelihoods} from lm-eval's --log_samples file."""
    scores = {}
    for line in _newest(output_path, f"samples_{TASK}_*.jsonl").read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        scores[sample["doc"]["id"]] = [float(r[0]) for r in sample["filtered_resps"]]
    return scores


def lm_eval_accuracy(output_path: Path) -> tuple[float, int]:
    """lm-eval's own aggregated accuracy of the task and how many questions it counted (its results file)."""
    results = json.loads(_newest(output_path, "results_*.json").read_text(encoding="utf-8"))
    return float(results["results"][TASK]["acc,none"]), int(results["n-samples"][TASK]["effective"])


def _newest(output_path: Path, pattern: str) -> Path:
    files = sorted(output_path.rglob(pattern))
    if not files:
        raise SystemExit(f"no {pattern} under {output_path}")
    return files[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, seconds: float) -> None:
    import httpx
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"tinyvllm serve exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"tinyvllm serve not ready after {seconds:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF model directory (served and tokenizer for lm-eval)")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--subset", help="exactly these questions instead of --limit (tinyvllm eval --subset FILE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--score-tol", type=float, default=1e-4, help="largest allowed |score difference|, nats")
    p.add_argument("--margin", type=float, default=5e-3, help="near-tie margin, nats (lm-eval's top two)")
    p.add_argument("--serve-args", default="", help="extra `tinyvllm serve` flags, e.g. '--num-blocks 64'")
    p.add_argument("--startup-seconds", type=float, default=300)
    p.add_argument("--lm-eval-path", default="", help="extra sys.path entry for lm_eval only (a pip --target dir)")
    p.add_argument("--out", default=str(ROOT / "out" / "lm-eval-check"))
    args = p.parse_args(argv)
    out = Path(args.out)
    t0 = time.perf_counter()
    from tinyvllm.cli import main as tinyvllm_main
    from tinyvllm.evaluation.tasks import load_mmlu

    selection = ["--subset", args.subset] if args.subset else ["--limit", str(args.limit), "--seed", str(args.seed)]
    rc = tinyvllm_main(["eval", "--model", args.model, "--tasks", "mmlu", *selection, "--max-context",
                        str(args.max_context), "--no-special-tokens", "--no-plot", "--out", str(out / "tinyvllm")])
    ours = json.loads((out / "tinyvllm" / "results.json").read_text())
    items = {i["id"]: i for i in ours["items"] if i["status"] == "ok"}
    by_id = {q.id: q for q in load_mmlu()}
    task_dir = out / "lm_eval_task"
    write_lm_eval_task([by_id[i] for i in items], task_dir)  # too-long questions left out of both

    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # Both sides cap prompt + continuation at --max-context tokens: lm-eval keeps max_length - 1 tokens of it
    # (one for generation), and the server needs room for the one token each request generates.
    serve = subprocess.Popen([sys.executable, "-m", "tinyvllm.cli", "serve", "--model", args.model, "--port",
                              str(port), "--max-model-len", str(args.max_context + 1), "--served-model-name", "tinyvllm",
                              *args.serve_args.split()],
                             env=env, stdout=open(out / "serve.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/v1/models", serve, args.startup_seconds)
        model_args = (f"model=tinyvllm,base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={args.model},"
                      f"tokenized_requests=True,num_concurrent=8,max_retries=1,max_length={args.max_context + 1}")
        command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args, "--tasks", TASK,
                   "--include_path", str(task_dir), "--log_samples", "--output_path", str(out / "lm_eval")]
        print("+", " ".join(command), flush=True)
        lm_env = {**env, "HF_DATASETS_OFFLINE": "1",
                  "PYTHONPATH": os.pathsep.join(x for x in (env["PYTHONPATH"], args.lm_eval_path) if x)}
        lm_rc = subprocess.run(command, env=lm_env).returncode
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    if lm_rc != 0:
        print(f"lm_eval failed ({lm_rc})")
        return 1
    report = compare(out, args.score_tol, args.margin)
    report.update(tinyvllm_eval_rc=rc, seconds=round(time.perf_counter() - t0, 1))
    report["passed"] = report["passed"] and rc == 0
    (out / "lm_eval_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    print("PASS" if report["passed"] else "FAIL")
    return 0 if report["passed"] else 1


def compare(out: Path, score_tol: float, margin: float) -> dict:
    """tinyvllm eval's results (OUT/tinyvllm) against lm-eval's (OUT/lm_eval), on the questions both ran."""
    from tinyvllm.evaluation.scoring import top_two_margin
    from tinyvllm.evaluation.tasks import load_mmlu
    ours = json.loads((out / "tinyvllm" / "results.json").read_text())
    items = {i["id"]: i for i in ours["items"] if i["status"] == "ok"}
    answers = {q.id: q.answer for q in load_mmlu() if q.id in items}
    theirs = lm_eval_samples(out / "lm_eval")
    acc_lm_eval, counted = lm_eval_accuracy(out / "lm_eval")
    diffs = {i: max(abs(a - b) for a, b in zip(items[i]["scores"], theirs[i])) for i in items if i in theirs}
    differ = sorted(i for i in diffs if "ABCD"[best(theirs[i])] != items[i]["prediction"])
    near_ties = [i for i in differ if top_two_margin(theirs[i]) < margin]
    acc_ours = sum(items[i]["correct"] for i in items) / max(1, len(items))
    report = {"questions": len(items), "scored_by_lm_eval": len(diffs), "counted_by_lm_eval": counted,
              "same_answer": len(diffs) - len(differ), "different_answers": differ,
              "different_near_ties": near_ties, "margin": margin,
              "max_score_diff": max(diffs.values(), default=None), "score_tol": score_tol,
              "accuracy_tinyvllm_eval": acc_ours, "accuracy_lm_eval": acc_lm_eval,
              "accuracy_from_lm_eval_scores": sum(best(theirs[i]) == answers[i] for i in diffs) / max(1, len(diffs))}
    report["passed"] = (len(items) > 0 and len(diffs) == counted == len(items) and len(near_ties) == len(differ)
                        and report["max_score_diff"] <= score_tol
                        and abs(acc_lm_eval - acc_ours) * len(items) <= len(near_ties) + 1e-9)
    return report


def best(scores: list[float]) -> int:
    """lm-eval's pick (np.argmax: the first of equal scores), the same rule as tinyvllm eval's best_choice."""
    return max(range(len(scores)), key=lambda k: (scores[k], -k))


if __name__ == "__main__":
    sys.exit(main())
