"""Small helpers the lessons' pycon blocks call, so the numbers a lesson shows come from the project itself (the
demo model's files, the engine's kernels, scheduler and block manager) and are checked like any doctest."""
from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def demo_config():
    """The demo model's ModelConfig (tinyvllm/model/demo_model/config.json)."""
    from tinyvllm.model.loader import read_model_config
    return read_model_config()


@lru_cache(maxsize=1)
def demo_weights() -> dict[str, np.ndarray]:
    """The demo model's host weights, as the loader reads them (bf16 bit patterns as uint16)."""
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    from tinyvllm.model.weights import load_weights
    return load_weights(DEMO_MODEL_DIR, demo_config())


@lru_cache(maxsize=1)
def demo_tokenizer():
    from tinyvllm.model.fixtures.demo import DEMO_MODEL_DIR
    from tinyvllm.model.tokenizer import Tokenizer
    return Tokenizer.from_model_dir(DEMO_MODEL_DIR)


def rows(values: np.ndarray, columns: int = 4, digits: int = 4) -> None:
    """Print the first `columns` values of each row of a 2-D array, one row a line."""
    for i, row in enumerate(np.asarray(values)):
        print(f"{i:3d}: " + " ".join(f"{v:{digits + 4}.{digits}f}" for v in row[:columns]))


# ---- 03: floating point and bfloat16 ------------------------------------------------------------------
def f32_fields(x: float) -> str:
    """A float32's bits as sign | exponent (8) | mantissa (23), and the exponent without its bias of 127."""
    u = int(np.float32(x).view(np.uint32))
    sign, exponent, mantissa = u >> 31, (u >> 23) & 0xFF, u & 0x7FFFFF
    return f"{sign} {exponent:08b} {mantissa:023b}  (2^{exponent - 127})"


def bf16_fields(bits: int) -> str:
    """A bf16's 16 bits as sign | exponent (8) | mantissa (7)."""
    bits = int(bits)
    sign, exponent, mantissa = bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F
    return f"{sign} {exponent:08b} {mantissa:07b}  (2^{exponent - 127})"


def bf16_weights(name: str, count: int = 4) -> None:
    """The first `count` weights of the demo model's tensor `name`: bits, fields, and the value they mean."""
    from kernels_numba.bf16 import bf16_to_f32_ref
    bits = demo_weights()[name].reshape(-1)[:count]
    print("bits    s exponent mantissa                value")
    for b, v in zip(bits, bf16_to_f32_ref(bits)):
        print(f"0x{int(b):04x}  {bf16_fields(b):28s} {v:.8g}")


def bf16_rounding(values) -> None:
    """float32 values rounded to bf16 as the engine does it (kernels_numba/bf16.py's f32_to_bf16, in a kernel),
    checked against its numpy twin; each value's fields, the bf16 it becomes, and the rounding error."""
    from numba import cuda
    from kernels_numba.bf16 import bf16_to_f32_ref, f32_to_bf16_device, f32_to_bf16_ref
    x = np.asarray(values, dtype=np.float32)
    bits = f32_to_bf16_device(cuda.to_device(x)).copy_to_host()
    assert np.array_equal(bits, f32_to_bf16_ref(x)), "the kernel and its numpy twin round differently"
    rounded = bf16_to_f32_ref(bits)
    for v, b, r in zip(x, bits, rounded):
        error = float(r) - float(v)
        print(f"{v:.9g}\n  float32  {f32_fields(v)}\n  bf16     {bf16_fields(b)}  0x{int(b):04x} = {r:.9g}"
              f"\n  error    {error:+.3g} ({abs(error) / abs(float(v)):.2%} of the value)" if v else f"{v}: exact")


# ---- 04: memory ----------------------------------------------------------------------------------------
LLAMA_3_2_1B = "Llama 3.2 1B"


def model_config(name: str = "demo"):
    """The demo model's ModelConfig, or Llama 3.2 1B's (from its published config.json)."""
    if name == "demo":
        return demo_config()
    assert name == LLAMA_3_2_1B, name
    from tinyvllm.model.config import ModelConfig
    from tinyvllm.model.fixtures.random_model import LLAMA_3_2_1B_CONFIG
    return ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)


def weight_groups(config) -> dict[str, int]:
    """Parameters of the model by part, from the tensors it needs (tinyvllm/model/weights.py)."""
    from tinyvllm.model.weights import expected_tensor_shapes
    groups = {"embedding": 0, "attention": 0, "mlp": 0, "norms": 0, "lm_head": 0}
    for name, shape in expected_tensor_shapes(config).items():
        part = ("embedding" if "embed_tokens" in name else "attention" if "self_attn" in name
                else "mlp" if ".mlp." in name else "lm_head" if name.startswith("lm_head") else "norms")
        groups[part] += int(np.prod(shape))
    return groups


def size(num_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"


def weight_memory(config) -> None:
    """Parameters and bf16 bytes of each part of the model."""
    groups = weight_groups(config)
    total = sum(groups.values())
    for part, params in groups.items():
        print(f"{part:10s} {params:>13,} parameters {params / total:4.0%}  {size(2 * params):>10s}")
    print(f"{'total':10s} {total:>13,} parameters       {size(2 * total):>10s} = {2 * total:,} bytes in bf16")


def kv_memory(config, tokens: int, block_size: int = 16) -> None:
    """The KV cache's bytes per token and per block (tinyvllm/runner/kv_pool.py:bytes_per_block), and for `tokens`
    tokens, in float32 and bfloat16."""
    from tinyvllm.runner.kv_pool import bytes_per_block
    for dtype in ("float32", "bfloat16"):
        per_token = bytes_per_block(config, 1, dtype)
        print(f"{dtype:9s} {size(per_token):>10s} a token  {size(bytes_per_block(config, block_size, dtype)):>10s} "
              f"a block of {block_size}  {size(tokens * per_token):>10s} for {tokens:,} tokens")


# ---- 18: batching --------------------------------------------------------------------------------------
def _step_line(output, names: dict[int, str]) -> str:
    parts = []
    for s in output.scheduled:
        name, seq = names[s.seq.seq_id], s.seq
        if s.start >= seq.num_prompt_tokens:
            parts.append(f"{name} decode")
        else:
            parts.append(f"{name} prefill {s.start}-{s.end}" + ("" if s.samples else f" of {seq.num_prompt_tokens}"))
    return ", ".join(parts)


def batching_steps(requests: dict[str, tuple[int, int]], batching: str = "continuous", max_num_seqs: int = 2,
                   max_num_batched_tokens: int = 8, block_size: int = 4, num_blocks: int = 32) -> None:
    """Run the engine's Scheduler (no model: each sampled token is a stand-in) over requests
    {name: (prompt tokens, output tokens)}, added at once, and print each step's decisions: the prefill
    chunks [start-end) and decodes it holds, its tokens, and which requests finish after it."""
    from tinyvllm.engine.block_manager import BlockManager
    from tinyvllm.engine.scheduler import Scheduler, SchedulerConfig
    from tinyvllm.engine.sequence import Sequence
    scheduler = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, True, batching),
                          BlockManager(num_blocks, block_size, enable_prefix_caching=False))
    names = {}
    for seq_id, (name, (prompt, output)) in enumerate(requests.items()):
        names[seq_id] = name
        scheduler.add(Sequence(seq_id, [1000 * (seq_id + 1) + i for i in range(prompt)], output))
    step = 0
    while scheduler.has_unfinished:
        step += 1
        output = scheduler.schedule()
        assert not output.is_empty, "the scheduler stalled"
        scheduler.update(output, {s.seq.seq_id: 7 for s in output.scheduled if s.samples})
        done = [s.seq for s in output.scheduled if s.seq.num_output_tokens >= s.seq.max_tokens]
        for seq in done:
            scheduler.finish(seq)
        finished = f"  -> {', '.join(names[s.seq_id] for s in done)} done" if done else ""
        used = f"{output.num_batched_tokens} of {max_num_batched_tokens}"
        print(f"step {step:2d} ({used:>7s} tokens): {_step_line(output, names)}{finished}")


# ---- 20: the paged KV cache -----------------------------------------------------------------------------
def block_tables(manager, seqs: dict[str, object]) -> None:
    """Each sequence's block table, then the pool: each block's ref count and state (used, cached, free)."""
    for name, seq in seqs.items():
        print(f"{name}: {seq.block_table}  ({seq.num_computed_tokens} tokens computed, "
              f"{seq.num_cached_tokens} from the prefix cache)")
    states = manager.block_states()
    counts = manager.ref_counts()
    used = [i for i, s in enumerate(states) if s != "free"]
    print("blocks: " + "  ".join(f"{i}:{states[i]}x{counts[i]}" if counts[i] else f"{i}:{states[i]}" for i in used)
          + f"  ({manager.num_free_blocks} of {manager.num_blocks} free)")


# ---- 05: one step, stage by stage -----------------------------------------------------------------------
def walk_step(engine, stages: bool = True) -> None:
    """Run the engine's next step stage by stage (LLMEngine.step_stages, as the debugger does): each stage's
    name, output shape and kernel (unless `stages` is False), then each request's output tokens so far."""
    run = engine.step_stages()
    while True:
        try:
            stage = next(run)
        except StopIteration as done:
            outputs = done.value
            break
        if stages:
            print(f"{stage.name:22s} {str(tuple(stage.output.shape)):12s} {stage.kernel}")
    for out in outputs:
        print(f"request {out.request_id}: token ids {out.token_ids}")


def step_outputs(engine) -> dict[str, np.ndarray]:
    """Run the engine's next step stage by stage; every stage's output, on the host, by stage name."""
    run, outputs = engine.step_stages(), {}
    while True:
        try:
            stage = next(run)
        except StopIteration:
            return outputs
        outputs[stage.name] = stage.to_host()


def rms(x: np.ndarray) -> np.ndarray:
    """Each row's root mean square, sqrt(mean(x^2)), over its last axis."""
    x = np.asarray(x, dtype=np.float64)
    return np.sqrt((x * x).mean(axis=-1))


def paged_vs_contiguous(block_table: list[int], num_tokens: int = 10, block_size: int = 4) -> None:
    """The same random q, K, V (4 heads, 2 KV heads, head_dim 16) attended to twice: K/V stored through
    `block_table` in a paged pool and read by the engine's paged_attention_per_query, and stored in
    lessons/contiguous_cache.py's contiguous cache and read by its kernel. Prints the slots and whether the two
    outputs are bit for bit equal."""
    from numba import cuda
    from kernels_numba.attention.paged_kv import write_kv_paged
    from kernels_numba.attention.per_query import paged_attention_per_query
    from lessons.contiguous_cache import attention, write_kv
    rng = np.random.default_rng(0)
    q = rng.standard_normal((num_tokens, 4, 16)).astype(np.float32)
    k, v = rng.standard_normal((2, num_tokens, 2, 16)).astype(np.float32)
    table, positions = np.array([block_table], np.int32), np.arange(num_tokens, dtype=np.int32)
    slots = (table[0, positions // block_size] * block_size + positions % block_size).astype(np.int32)
    seq, d, scale = np.zeros(num_tokens, np.int32), cuda.to_device, 0.25
    pool_shape = (max(block_table) + 1, block_size, 2, 16)
    k_pool, v_pool = d(np.zeros(pool_shape, np.float32)), d(np.zeros(pool_shape, np.float32))
    write_kv_paged(d(k), d(v), k_pool, v_pool, d(slots))
    paged = paged_attention_per_query(d(q), k_pool, v_pool, d(table), d(seq), d(positions), scale).copy_to_host()
    cache_shape = (1, len(block_table) * block_size, 2, 16)
    k_cache, v_cache = d(np.zeros(cache_shape, np.float32)), d(np.zeros(cache_shape, np.float32))
    write_kv(d(k), d(v), k_cache, v_cache, d(seq), d(positions))
    contiguous = attention(d(q), k_cache, v_cache, d(seq), d(positions), scale).copy_to_host()
    print(f"slots of positions 0..{num_tokens - 1}: {slots.tolist()}")
    print(f"paged == contiguous, bit for bit: {np.array_equal(paged, contiguous)}")
