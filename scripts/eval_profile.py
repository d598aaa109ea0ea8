"""Where `tinyvllm eval`'s time goes: host scheduling, prefill kernels, logits/logprobs, tokenization.

Runs MMLU 0-shot loglikelihood (a stratified --limit, or all 14,042) through the in-process engine once for
warm-up (kernels compile), then once timed with each phase's time measured by wrapping the engine's methods
(exclusive times: a phase nested in another is subtracted from it):

    tokenize      prepare_task (every prompt) + continuation_ids (prompt + each answer letter)
    submit        engine.add_request: Sequence, prompt checks, scheduler.add
    schedule      Scheduler.schedule: admission, prefix-cache lookup (block hashes), block allocation
    build batch   runner.inputs.build_inputs: token ids, positions, slot mapping, block tables, logits plan
    upload        ModelRunner.upload: one host-to-device copy, prefill attention tiles (host numpy)
    forward       the forward pass's kernels, embedding to LM head (synchronized at its end: GPU time)
    sampler       LogitsPlan.sampler_logits + sampler.next_tokens (argmax, the tokens' copy to the host)
    logprobs      record_logprobs: log-sum-exp, gather of the answer letters' logprobs, copy, dicts
    update        Scheduler.update: advance sequences, commit full blocks (hashes)
    finish        _check_stop + _output + release_request: stop rules, RequestOutputs, table clean-up
    step other    the rest of LLMEngine.step (metrics, lists)
    eval loop     EngineBackend outside the engine: the on_output callbacks, trie scores, progress

Prints one table per engine setting (phase, seconds, ms per step, share of the wall time) and the prompt
tokens per second with and without the host phases; --sweep tries several (max_num_seqs, max_num_batched_tokens)
pairs on the same questions. --cprofile writes the timed run's Python profile (OUT/eval-profile.prof and the
top 40 functions by own time) -- on a GPU that shows the host work; the kernels' launches are in it too.
--stub-kernels replaces the forward pass and the sampling/logprob kernels with numpy on random logits, so the
host side alone can be profiled in the simulator (the demo model's numbers then mean host time only).

    python scripts/eval_profile.py --model /tmp/smollm2-hf --limit 3000              # on the H200
    python scripts/eval_profile.py --model /tmp/smollm2-hf --limit 3000 --sweep
    NUMBA_ENABLE_CUDASIM=1 python scripts/eval_profile.py --stub-kernels --limit 400 --warmup 0   # host only
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = ("tokenize", "submit", "schedule", "build batch", "upload", "forward", "sampler", "logprobs", "update",
          "finish", "step other", "eval loop")
HOST_PHASES = ("submit", "schedule", "build batch", "upload", "sampler", "logprobs", "update", "finish",
               "step other", "eval loop")


class PhaseTimer:
    """Exclusive wall time per phase: a timed call nested in another is charged to its own phase only."""

    def __init__(self, synchronize):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self.synchronize = synchronize
        self._stack: list[list] = []  # [phase, start, time spent in nested timed calls]

    def _enter(self, phase: str) -> None:
        self._stack.append([phase, time.perf_counter(), 0.0])

    def _exit(self, sync: bool = False) -> None:
        if sync:
            self.synchronize()
        phase, start, nested = self._stack.pop()
        spent = time.perf_counter() - start
        self.seconds[phase] += spent - nested
        self.calls[phase] += 1
        if self._stack:
            self._stack[-1][2] += spent

    def wrap(self, owner, name: str, phase: str, sync: bool = False) -> None:
        """Time owner.name (a method of a class or instance, or a module's function) as `phase`."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self._enter(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self._exit(sync)
        setattr(owner, name, timed)

    def wrap_generator(self, owner, name: str, phase: str, sync: bool = False) -> None:
        """Time a generator method used with `yield from` (the forward pass's stages)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self._enter(phase)
            try:
                result = yield from original(*args, **kwargs)
                return result
            finally:
                self._exit(sync)
        setattr(owner, name, timed)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self.gc_seconds, self.gc_collections = 0.0, [0, 0, 0]
        self.gc_by_phase = dict.fromkeys(PHASES, 0.0)

    def on_gc(self, phase: str, info: dict) -> None:
        """gc.callbacks: Python's cyclic garbage collector's pauses (inside whatever phase they hit)."""
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            spent = time.perf_counter() - self._gc_start
            self.gc_seconds += spent
            if self._stack:
                self.gc_by_phase[self._stack[-1][0]] += spent
            self.gc_collections[info["generation"]] += 1


def install_timers(timer: PhaseTimer) -> None:
    """Wrap the engine's phases (class attributes: every engine made afterwards is timed)."""
    from tinyvllm.engine import engine as engine_module
    from tinyvllm.evaluation import backends, runner
    from tinyvllm.runner.logprobs import LogitsPlan
    from tinyvllm.runner import model_runner, sampler
    from tinyvllm.runner.model_runner import ModelRunner
    from tinyvllm.engine.scheduler import Scheduler
    LLMEngine = engine_module.LLMEngine
    timer.wrap(runner, "prepare_task", "tokenize")
    timer.wrap(runner, "continuation_ids", "tokenize")
    timer.wrap(backends.EngineBackend, "loglikelihoods", "eval loop")
    timer.wrap(LLMEngine, "add_request", "submit")
    timer.wrap(LLMEngine, "step", "step other")
    timer.wrap(Scheduler, "schedule", "schedule")
    timer.wrap(model_runner, "build_inputs", "build batch")
    timer.wrap(ModelRunner, "upload", "upload")
    timer.wrap_generator(ModelRunner, "forward_stages", "forward", sync=True)
    timer.wrap(LogitsPlan, "sampler_logits", "sampler")
    timer.wrap(sampler, "next_tokens", "sampler")
    timer.wrap(sampler, "record_logprobs", "logprobs", sync=True)
    timer.wrap(Scheduler, "update", "update")
    for name in ("_check_stop", "_output", "release_request"):
        timer.wrap(LLMEngine, name, "finish")


def stub_kernels(vocab_size: int) -> None:
    """Replace the forward pass and the sampling / logprob kernels with numpy on random logits (host-side
    profiling in the simulator, where the kernels would take all the time)."""
    from kernels_numba.common import cuda
    from tinyvllm.runner import logprobs as logprobs_module
    from tinyvllm.runner import model_runner as model_runner_module
    from tinyvllm.runner import sampler as sampler_module
    from tinyvllm.runner.inputs import upload
    from tinyvllm.runner.model_runner import ModelRunner
    rng = np.random.default_rng(0)

    def forward_stages(self, batch, all_logits=False, synchronize=True):
        upload(batch, self.plan, all_logits)
        rows = batch.num_tokens if all_logits else len(batch.logits_rows)
        return cuda.to_device(rng.standard_normal((rows, vocab_size), dtype=np.float32))
        yield  # a generator, like the real one

    def host(a):
        return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)

    def take_rows(logits, rows):
        return cuda.to_device(host(logits)[host(rows)])

    def argmax(logits):
        return cuda.to_device(host(logits).argmax(axis=1).astype(np.int32))

    def logsumexp(logits):
        x = host(logits)
        m = x.max(axis=1)
        return cuda.to_device(m + np.log(np.exp(x - m[:, None]).sum(axis=1)))

    def gather_logprobs(logits, lse, rows, tokens):
        r, t = host(rows), host(tokens)
        return cuda.to_device(host(logits)[r, t] - host(lse)[r])

    ModelRunner.forward_stages = forward_stages
    for module in (model_runner_module, sampler_module, logprobs_module):
        for name, fn in (("take_rows", take_rows), ("argmax", argmax), ("logsumexp", logsumexp),
                         ("gather_logprobs", gather_logprobs)):
            if hasattr(module, name):
                setattr(module, name, fn)


def run_once(model, tokenizer, limit: int, max_num_seqs: int, max_tokens: int, args, timer: PhaseTimer | None):
    from tinyvllm.engine.engine import EngineConfig, LLMEngine
    from tinyvllm.evaluation.backends import EngineBackend
    from tinyvllm.evaluation.runner import EvalConfig, prepare_task, run_task, select
    engine = LLMEngine(model, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens,
                                           num_blocks=args.num_blocks, gpu_memory_fraction=args.gpu_memory_fraction,
                                           max_model_len=args.max_context), log=lambda m: None)
    if timer:
        timer.reset()
    start = time.perf_counter()
    config = EvalConfig(limit=limit or None, max_context=args.max_context)
    task = prepare_task("mmlu", config, tokenizer)
    selected = select([task], config)["mmlu"]
    run = run_task(task, selected, config, EngineBackend(engine), tokenizer)
    wall = time.perf_counter() - start
    done = [r for r in run.results if r.evaluated]
    return {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_tokens, "questions": len(done),
            "prompt_tokens": sum(r.prompt_tokens for r in done), "wall_seconds": wall, "eval_seconds": run.seconds,
            "steps": engine.num_steps, "prefix_cache_hit_rate": engine.block_manager.prefix_hit_rate}


def format_table(row: dict, timer: PhaseTimer) -> str:
    wall, steps = row["wall_seconds"], max(1, row["steps"])
    lines = [f"max_num_seqs {row['max_num_seqs']}, max_num_batched_tokens {row['max_num_batched_tokens']}: "
             f"{row['questions']} questions, {row['prompt_tokens']} prompt tokens, {row['steps']} engine steps "
             f"({row['prompt_tokens'] / steps:.0f} tokens/step), wall {wall:.2f} s",
             "| phase | seconds | ms / step | share of wall |", "|---|---:|---:|---:|"]
    for phase in PHASES:
        s = timer.seconds[phase]
        lines.append(f"| {phase} | {s:.3f} | {1e3 * s / steps:.2f} | {100 * s / wall:.1f} % |")
    host = sum(timer.seconds[p] for p in HOST_PHASES)
    accounted = sum(timer.seconds.values())
    lines.append(f"| (unaccounted) | {wall - accounted:.3f} | {1e3 * (wall - accounted) / steps:.2f} | "
                 f"{100 * (wall - accounted) / wall:.1f} % |")
    forward = timer.seconds["forward"]
    lines.append(f"\nprompt tok/s: {row['prompt_tokens'] / wall:.0f} over the wall time (tokenization included), "
                 f"{row['prompt_tokens'] / row['eval_seconds']:.0f} over the scoring; "
                 f"{row['prompt_tokens'] / forward if forward else 0:.0f} over the forward pass alone. "
                 f"Host phases {host:.2f} s = {1e3 * host / steps:.2f} ms/step, "
                 f"{1e6 * host / max(1, row['questions']):.0f} us/question. Garbage collector: "
                 f"{timer.gc_seconds:.3f} s in {'/'.join(map(str, timer.gc_collections))} collections of "
                 f"generations 0/1/2 (inside the phases above: "
                 + ", ".join(f"{p} {t:.3f} s" for p, t in timer.gc_by_phase.items() if t >= 0.0005) + ").")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="HF model directory (default: the demo model)")
    p.add_argument("--limit", type=int, default=3000, help="questions (0: all 14,042)")
    p.add_argument("--warmup", type=int, default=64, help="questions of the untimed warm-up run (0: none)")
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--sweep", action="store_true",
                   help="also (32, 4096), (128, 8192), (512, 32768), (1024, 65536) on the same questions")
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--gpu-memory-fraction", type=float, default=0.3)
    p.add_argument("--cprofile", action="store_true", help="also a cProfile of the (first) timed run")
    p.add_argument("--stub-kernels", action="store_true", help="numpy instead of kernels: host time only")
    p.add_argument("--out", default=str(ROOT / "out" / "eval-profile"))
    args = p.parse_args()
    from kernels_numba.common import SIMULATOR, cuda
    from tinyvllm.model.loader import load_model
    model = load_model(args.model, log=lambda m: None)
    if args.stub_kernels:
        stub_kernels(model.config.vocab_size)
    timer = PhaseTimer((lambda: None) if SIMULATOR else cuda.synchronize)
    timer.reset()
    install_timers(timer)
    gc.callbacks.append(timer.on_gc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = [(args.max_num_seqs, args.max_num_batched_tokens)]
    if args.sweep:
        settings += [s for s in ((32, 4096), (128, 8192), (512, 32768), (1024, 65536)) if s not in settings]
    if args.warmup:
        run_once(model, model.tokenizer, args.warmup, *settings[0], args, None)
    rows, tables = [], []
    for i, (seqs, tokens) in enumerate(settings):
        profiler = cProfile.Profile() if args.cprofile and i == 0 else None
        if profiler:
            profiler.enable()
        row = run_once(model, model.tokenizer, args.limit, seqs, tokens, args, timer)
        if profiler:
            profiler.disable()
            profiler.dump_stats(out / "eval-profile.prof")
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
            (out / "eval-profile-top.txt").write_text(text.getvalue())
            print(text.getvalue()[:6000])
        row["phases"] = dict(timer.seconds)
        row["calls"] = dict(timer.calls)
        row["gc_seconds"], row["gc_collections"] = timer.gc_seconds, list(timer.gc_collections)
        rows.append(row)
        tables.append(format_table(row, timer))
        print(tables[-1], flush=True)
    (out / "eval-profile.json").write_text(json.dumps({"model": str(model.model_dir), "simulator": SIMULATOR,
                                                       "stub_kernels": args.stub_kernels, "runs": rows}, indent=1))
    (out / "eval-profile.md").write_text(f"# tinyvllm eval profile: `{model.model_dir}`\n\n" + "\n\n".join(tables) + "\n")
    if len(rows) > 1:
        print("\n| max_num_seqs | max_num_batched_tokens | steps | wall s | prompt tok/s (scoring) |\n|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['max_num_seqs']} | {r['max_num_batched_tokens']} | {r['steps']} | {r['wall_seconds']:.2f} | "
                  f"{r['prompt_tokens'] / r['eval_seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
