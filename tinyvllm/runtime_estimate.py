"""How long work takes in numba's CUDA simulator, estimated before it starts from the model's shape and the work.

The simulator runs every CUDA thread as a Python thread, and there every kernel runs a small grid-stride grid
(kernels_numba.common.SIMULATOR_GRID; the projections are all gemv, attention is per_query: KernelPlan's
simulator column). So a step costs what its kernels' Python loops execute, not what they launch:

    seconds = LAUNCH_S x launches                9 kernels a layer and 4 a step, each starting its threads
            + WEIGHT_S x weight reads            gemv reads every weight once per chunk of MAX_GEMV_TOKENS tokens
            + MAC_S x multiply-adds              projections of every token, the LM head of every sampled row
            + ATTENTION_S x attention terms      per (query head, visible key, head_dim element)

The engine's schedule is modelled in waves of max_num_seqs requests: each wave's prompts prefilled in chunks of
max_num_batched_tokens, then decoded together until its longest request ends. Prefix caching is ignored (eval's
few-shot prompts share prefixes, so those runs take less).

Calibration: process CPU time of single steps (LLMEngine.step), fitted by least squares on relative error, on a
2-core x86 machine: the demo model (hidden 64, intermediate 128, 2 layers, 4 heads of 16), a wide one (hidden 128,
intermediate 384, 8 heads), a deep one (6 layers), one with heads of 64, and a bigger one (hidden 256, intermediate
1024, 2M layer weights); prefills of 12 to 80 tokens in batches of 1 and 4, their decode steps, and demo prefills of
300 and 600 tokens (where attention dominates). The 38 steps are within 0.71 to 1.57 of their estimates; the bigger
model's come out high (1.3 to 1.6), so models far past the calibration (SmolLM2-135M: 106M layer weights) are likely
overestimated, by up to ~2x. CPU time, not wall time: the estimate is for an idle machine, and with other processes
on the cores wall time was up to 4x the CPU time. Checked against a reported `tinyvllm eval --limit 10` on the demo
model (799 s wall): estimated at about 520 s (each question's second answer token, a request of its own, is not
counted).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import expected_tensor_shapes

# seconds per unit, fitted as the module docstring says
LAUNCH_S = 1.9e-2
WEIGHT_S = 3.9e-6
MAC_S = 7.2e-7
ATTENTION_S = 4.3e-6

KERNELS_PER_LAYER, KERNELS_PER_STEP = 9, 4   # forward.AddRMSNormLayer's; embedding, final norm, LM head, sampling
GEMV_CHUNK = 32         # kernels_numba.matmul.MAX_GEMV_TOKENS in the simulator (not imported: no numba here)
NOTICE_MIN_S = 30.0     # shorter work starts quietly: the demo's check-goldens (21 s), generate of 8 tokens (8 s)


@dataclass(frozen=True)
class Work:
    """What the engine is asked to do: per request, its prompt tokens and the new tokens it may generate."""
    prompt_tokens: tuple[int, ...]
    new_tokens: tuple[int, ...]
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    every_prompt_token_logits: bool = False     # check-goldens: the first step computes logits for every row

    def __post_init__(self):
        assert len(self.prompt_tokens) == len(self.new_tokens)
        assert self.max_num_seqs > 0 and self.max_num_batched_tokens > 0


@dataclass
class SimulatorCounts:
    """The units the estimate prices (see the module docstring)."""
    steps: int = 0
    launches: int = 0
    weight_reads: int = 0
    macs: int = 0
    attention: int = 0

    def seconds(self) -> float:
        return (LAUNCH_S * self.launches + WEIGHT_S * self.weight_reads + MAC_S * self.macs
                + ATTENTION_S * self.attention)


def layer_weights(c: ModelConfig) -> int:
    """Weights of one decoder layer's projections: q|k|v, o_proj, gate|up, down_proj (the model's tensor shapes)."""
    return sum(math.prod(shape) for name, shape in expected_tensor_shapes(c).items()
               if name.startswith("model.layers.0.") and name.endswith("_proj.weight"))


def add_step(counts: SimulatorCounts, c: ModelConfig, per_layer: int, tokens: int, logits_rows: int,
             visible_keys: int) -> None:
    """One forward step over `tokens` tokens, `logits_rows` of them through the LM head, whose queries see
    `visible_keys` keys in all; `per_layer`: layer_weights(c)."""
    head = c.vocab_size * c.hidden_size
    counts.steps += 1
    counts.launches += KERNELS_PER_LAYER * c.num_hidden_layers + KERNELS_PER_STEP
    counts.weight_reads += (c.num_hidden_layers * per_layer * math.ceil(tokens / GEMV_CHUNK)
                            + head * math.ceil(logits_rows / GEMV_CHUNK))
    counts.macs += c.num_hidden_layers * per_layer * tokens + head * logits_rows
    counts.attention += c.num_hidden_layers * c.num_attention_heads * c.head_dim * visible_keys


def simulator_counts(c: ModelConfig, work: Work) -> SimulatorCounts:
    """The counts of `work` on a model of config `c`, scheduled in waves (the module docstring)."""
    counts, per_layer = SimulatorCounts(), layer_weights(c)
    requests = list(zip(work.prompt_tokens, work.new_tokens))
    for start in range(0, len(requests), work.max_num_seqs):
        wave = requests[start:start + work.max_num_seqs]
        total_prompt = sum(p for p, _ in wave)
        chunks = max(1, math.ceil(total_prompt / work.max_num_batched_tokens))
        keys = sum(p * (p + 1) // 2 for p, _ in wave)
        rows = total_prompt if work.every_prompt_token_logits else len(wave)
        for i in range(chunks):  # the wave's prompt tokens, keys and sampled rows spread evenly over its chunks
            add_step(counts, c, per_layer, _share(total_prompt, i, chunks), _share(rows, i, chunks),
                     _share(keys, i, chunks))
        for j in range(1, max((n for _, n in wave), default=1)):  # decode: the first new token came with the prefill
            running = [p for p, n in wave if n > j]
            # each running request's token at position p + j - 1 sees p + j keys
            add_step(counts, c, per_layer, len(running), len(running), sum(p + j for p in running))
    return counts


def _share(n: int, i: int, parts: int) -> int:
    """Part i of n split into `parts` near-equal whole parts."""
    return n * (i + 1) // parts - n * i // parts


def estimate_seconds(c: ModelConfig, work: Work) -> float:
    """Seconds `work` takes in the simulator on an otherwise idle machine (within a factor of ~2)."""
    return simulator_counts(c, work).seconds()


def format_duration(seconds: float) -> str:
    """'40 s', '3 min', '2.5 h': a rough duration, as rough as the estimate."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def engine_work(engine, request_ids, every_prompt_token_logits: bool = False) -> Work:
    """The Work of requests queued in an LLMEngine (those it rejected do not run)."""
    queued = [engine.request(r) for r in request_ids if engine.request(r).error is None]
    return Work(tuple(len(r.prompt_token_ids) for r in queued), tuple(r.seq.max_tokens for r in queued),
                engine.config.max_num_seqs, engine.config.max_num_batched_tokens, every_prompt_token_logits)


def engine_estimate(engine, work: Work) -> float | None:
    """Seconds `work` takes on `engine`'s model in the simulator; None on a GPU (no estimate there)."""
    from kernels_numba.common import SIMULATOR
    return estimate_seconds(engine.model.config, work) if SIMULATOR else None


def simulator_notice(seconds: float | None, what: str) -> str | None:
    """The line to print before long simulator work (None: on a GPU, or quick enough to need none)."""
    if seconds is None or seconds < NOTICE_MIN_S:
        return None
    return (f"simulator: about {format_duration(seconds)} for {what} on this model "
            f"(no GPU: numba's CUDA simulator runs each GPU thread as a Python thread; see README)")


def announce(seconds: float | None, what: str, out=None) -> None:
    """Print the simulator notice for work estimated at `seconds` (engine_estimate), when it is due."""
    notice = simulator_notice(seconds, what)
    if notice:
        print(notice, file=out or sys.stderr, flush=True)
