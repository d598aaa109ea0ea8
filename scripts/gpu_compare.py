"""Full-size check on a GPU: tinyvllm vs HF transformers, stage by stage, on the exact Llama-3.2-1B shape.

Writes a model directory of seeded random BF16 weights (tinyvllm.model.fixtures.random_model), runs HF transformers
(float32 compute on the same bf16 weights, same GPU) to capture every stage and a greedy continuation,
then drives tinyvllm's stepping forward pass over the same prompts and compares, three ways: the prompts
prefilled in one step, each prompt prefilled alone, and each prompt's first decode step (one token at
position len(prompt), against HF's stages over the prompt and its first greedy token): the step that batch-1
generation runs, with the decode kernels (flash_decode_warps attention, the one-token fused GEMVs).

    python scripts/gpu_compare.py [--model-dir /tmp/llama-1b-random] [--new-tokens 32] [--out DIR] [--dtype f32]

`--dtype f32` writes the random weights as F32 (unrounded: tinyvllm computes with float32 weights, HF with the
same values) into a model dir of its own (default /tmp/llama-1b-random-f32).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "The capital of France is",
    "Write a haiku about a paged KV cache and the GPU it lives on.",
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Explain grouped-query attention in two sentences."}],
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=None, help="default: /tmp/llama-1b-random, -f32 with --dtype f32")
    parser.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="the random checkpoint's dtype")
    parser.add_argument("--hf-device", default="cuda", help="where HF transformers runs (cpu for a dry run)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--out", default=str(ROOT / "out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        result = fn()
        timings[name] = time.perf_counter() - start
        print(f"[{timings[name]:7.1f} s] {name}", flush=True)
        return result

    model_dir = Path(args.model_dir or "/tmp/llama-1b-random" + ("-f32" if args.dtype == "f32" else ""))
    if not (model_dir / "tokenizer.json").is_file():
        from tinyvllm.model.llama3_tokenizer import write_llama3_tokenizer_files
        timed("build the Llama 3 tokenizer from llama-models", lambda: write_llama3_tokenizer_files(model_dir))
    if not (model_dir / "model.safetensors").is_file():
        from tinyvllm.model.fixtures.random_model import write_random_model
        timed(f"write random Llama-3.2-1B-shaped {args.dtype} weights",
              lambda: write_random_model(model_dir, seed=0, dtype=args.dtype))

    from tinyvllm.model.tokenizer import Tokenizer
    tok = Tokenizer.from_model_dir(model_dir)
    prompt_ids = [tok.encode_chat(p, date_string="26 Jul 2024") if isinstance(p, list) else tok.encode(p)
                  for p in PROMPTS]

    import numpy as np
    import torch
    from goldens.hf_reference import capture_stages, greedy_continuation, load_hf_model
    hf = timed(f"HF load (float32 on {args.hf_device})", lambda: load_hf_model(model_dir, device=args.hf_device))
    hf_stages = timed("HF capture stages", lambda: [capture_stages(hf, ids) for ids in prompt_ids])
    hf_greedy = timed(f"HF greedy {args.new_tokens} tokens x {len(PROMPTS)}",
                      lambda: [greedy_continuation(hf, ids, args.new_tokens) for ids in prompt_ids])
    decode_ids = [ids + [int(greedy[0])] for ids, greedy in zip(prompt_ids, hf_greedy)]
    hf_decode_stages = timed("HF capture stages over prompt + first token",
                             lambda: [capture_stages(hf, ids) for ids in decode_ids])
    del hf
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.golden_check import DEFAULT_RTOL, Goldens, check_goldens
    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    # HF's captures become an in-memory golden file: the same checker as `tinyvllm check-goldens`.
    goldens = Goldens(Path("hf-live"), {"source": "HF transformers live on this GPU"}, [
        {"input_ids": np.array(ids, np.int32), **stages, "greedy_ids": np.array(greedy, np.int32)}
        for ids, stages, greedy in zip(prompt_ids, hf_stages, hf_greedy)])
    # no prefix caching: the second pass below must prefill each prompt whole again
    engine = timed("tinyvllm load + upload", lambda: LLMEngine(model_dir, EngineConfig(
        num_blocks=256, max_model_len=1024, max_num_batched_tokens=2048, enable_prefix_caching=False,
        precision="fp32")))  # HF float32 is the reference: the fp32 path
    from tinyvllm.engine.sampling_params import SamplingParams
    timed("tinyvllm warm-up (numba compile)", lambda: engine.generate(
        [prompt_ids[0], prompt_ids[1][:3]], SamplingParams(temperature=0.0, max_tokens=2)))
    report = timed(f"tinyvllm check: stages of {len(PROMPTS)} prompts + greedy {args.new_tokens} tokens",
                   lambda: check_goldens(engine, goldens, rtol=rtol))
    # Then each prompt in a step of its own: prompts of up to 32 tokens then run the fused-GEMV layer
    # (ModelRunner._fused_layers, what decode steps run) stage by stage; all together they are 74 tokens.
    alone = timed("tinyvllm check: each prompt in its own step", lambda: [check_goldens(
        engine, Goldens(goldens.path, goldens.meta, [prompt]), rtol=rtol) for prompt in goldens.prompts])
    decode_goldens = Goldens(goldens.path, goldens.meta, [{"input_ids": np.array(ids, np.int32), **stages}
                                                           for ids, stages in zip(decode_ids, hf_decode_stages)])
    decode = timed("tinyvllm check: each prompt's first decode step", lambda: check_first_decode_step(
        engine, decode_goldens, rtol))
    passes = [("all in one step", [[r for r in report.stages if r.prompt == p] for p in range(len(PROMPTS))],
               report.greedy),
              ("alone", [one.stages for one in alone], [one.greedy[0] for one in alone]),
              ("decode step", [stages for stages, _ in decode], [first for _, first in decode])]

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (simulator dry run)"
    lines = [f"# tinyvllm vs HF transformers on {device}",
             "", f"Model: seeded random {args.dtype.upper()} weights of the exact Llama-3.2-1B shape ({model_dir}); "
             f"HF transformers {__import__('transformers').__version__} float32 on the same weights; "
             f"tinyvllm's device weights: {engine.model.weights.embed_tokens.dtype}; "
             f"torch {torch.__version__}.", f"Stage passes when max|ours-HF|/max|HF| <= {rtol:g}.", "",
             "| step | prompt | tokens | step's layer | stages passed | worst stage | worst rel err | "
             "logits rel err | greedy agree |", "|---|---|---|---|---|---|---|---|---|"]
    all_ok = True
    summary = []
    for mode, results, completions in passes:
        for p, (stages, greedy, golden_ids) in enumerate(zip(results, completions, hf_greedy)):
            passed = sum(s.passed for s in stages)
            worst = max(stages, key=lambda s: s.max_rel)
            logits = next(s for s in stages if s.stage == "logits")
            agree = greedy.agreeing_prefix
            step_tokens = {"alone": len(prompt_ids[p]), "decode step": 1}.get(mode, sum(map(len, prompt_ids)))
            layer = "fused-GEMV" if engine.runner.forward_pass.fuses_norms(step_tokens) else "add_rmsnorm"
            all_ok &= passed == len(stages) and agree == len(greedy.golden)
            lines.append(f"| {mode} | {p} | {len(prompt_ids[p])} | {layer} | {passed}/{len(stages)} | {worst.stage} | "
                         f"{worst.max_rel:.2e} | {logits.max_rel:.2e} | {agree}/{len(greedy.golden)} |")
            summary.append({"prefill": mode, "prompt": p, "prompt_tokens": len(prompt_ids[p]), "layer": layer,
                            "stages_passed": passed, "stages": len(stages), "greedy_agree": agree,
                            "greedy_total": len(greedy.golden),
                            "per_stage": [{"stage": s.stage, "max_abs": s.max_abs, "max_rel": s.max_rel}
                                          for s in stages]})
    lines += ["", "Wall time (s): " + ", ".join(f"{k}: {v:.1f}" for k, v in timings.items()), "",
              "Result: " + ("PASS" if all_ok else "FAIL")]
    report = "\n".join(lines)
    print(report)
    (out / "gpu_compare.md").write_text(report + "\n")
    (out / "gpu_compare.json").write_text(json.dumps({"summary": summary, "timings": timings}, indent=1))
    return 0 if all_ok else 1


def check_first_decode_step(engine, goldens, rtol: float) -> list[tuple[list, object]]:
    """Per golden prompt (input_ids = prompt + HF's first greedy token): prefill the prompt alone, then step
    the decode step of that token stage by stage and compare its one row of each stage with the golden's
    last position. Returns (stage results, GreedyResult of the first token) per prompt; a first token that
    differs from HF's makes the decode comparison moot, and fails it."""
    from tinyvllm.golden_check import GreedyResult, compare_scheduled_rows
    from tinyvllm.engine.sampling_params import SamplingParams
    results = []
    for p, golden in enumerate(goldens.prompts):
        ids = golden["input_ids"].tolist()
        request_id = engine.add_request(ids[:-1], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        while not engine.request(request_id).seq.output_token_ids:
            engine.step()
        first = GreedyResult(p, ids[-1:], engine.request(request_id).seq.output_token_ids[:1])
        stages = engine.step_stages(all_logits=True)
        compared = []
        try:
            while True:
                stage = next(stages)
                assert [s.num_new_tokens for s in engine.last_schedule.scheduled] == [1], "not a lone decode step"
                for result in compare_scheduled_rows(engine, stage, goldens, {request_id: p}, rtol):
                    result.passed &= first.passed  # another first token: the rows had different inputs
                    compared.append(result)
        except StopIteration:
            pass
        while engine.has_unfinished_requests():
            engine.step()
        results.append((compared, first))
    return results


if __name__ == "__main__":
    sys.exit(main())
