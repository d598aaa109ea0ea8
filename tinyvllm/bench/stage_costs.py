"""What each forward-pass stage must move and compute: the yardstick for GB/s and TFLOP/s per kernel.

Counts are the minimum a correct kernel needs: every weight read once (2 bytes of bf16, or 4 of an F32
checkpoint's float32: `weight_bytes`), float32 activations
read and written once (4 bytes), each sequence's cached K/V read once per KV head (GQA heads share it; 4 bytes
an element, 2 from a bf16 pool: `kv_element_bytes`),
and 2 FLOPs per multiply-add. A kernel that re-reads data moves more than this, so the GB/s derived from
these counts is what the stage achieved *usefully*.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyvllm.model.config import ModelConfig
from tinyvllm.runner.inputs import ForwardBatch

BF16, F32 = 2, 4


@dataclass(frozen=True)
class StageCost:
    bytes: int
    flops: int


def stage_costs(config: ModelConfig, batch: ForwardBatch, logits_rows: int, fused: bool = False,
                weight_bytes: int = BF16, kv_element_bytes: int = F32) -> dict[str, StageCost]:
    """Cost of each stage kind of one forward over `batch` (per layer for layer stages), by the stage
    name's last part: embedding, input_norm, q, k, v, attn, o_proj, attn_residual, post_norm, mlp, output,
    final_norm, logits. Fused launches are counted where they run (model_runner's docstring): q is the
    q|k|v projection and the K/V write, attn_residual and output each a residual add + RMSNorm; k, v, post_norm and
    final_norm launch nothing (input_norm launches only in layer 0). With `fused` (the fused-GEMV layer,
    ModelRunner._fused_layers): input_norm and post_norm are RMSNorm + the projection that reads it (the
    normed rows written once more; input_norm also RoPE and the K/V write, writing q, k and v where the
    projection wrote q|k|v; post_norm also the SwiGLU gate), q launches nothing, o_proj and mlp (down_proj
    alone) end in the residual add, attn_residual and output launch nothing, final_norm is a plain RMSNorm."""
    c = config
    T, H, I, V = batch.num_tokens, c.hidden_size, c.intermediate_size, c.vocab_size
    q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim

    def linear(rows: int, n_in: int, n_out: int) -> StageCost:
        return StageCost(n_out * n_in * weight_bytes + rows * (n_in + n_out) * F32, 2 * rows * n_in * n_out)

    def norm(rows: int) -> StageCost:
        return StageCost(H * weight_bytes + 2 * rows * H * F32, 4 * rows * H)

    # attention: each sequence's context K and V (its longest query's keys), the queries, the outputs;
    # every query scores and weighs the keys up to its own position, for every query head
    context = {}
    for seq, pos in zip(batch.query_seq.tolist(), batch.positions.tolist()):
        context[seq] = max(context.get(seq, 0), pos + 1)
    kv_bytes = sum(context.values()) * kv_width * 2 * kv_element_bytes
    visible_keys = int(np.sum(batch.positions.astype(np.int64) + 1))
    attention = StageCost(kv_bytes + T * 2 * q_width * F32, 4 * visible_keys * q_width)  # q in, output out
    kv_write = StageCost(T * 2 * kv_width * kv_element_bytes, 0)  # each token's k and v stored in the pool
    qkv = linear(T, H, q_width + 2 * kv_width)
    mlp = linear(T, H, 2 * I)
    down = linear(T, I, H)
    none = StageCost(0, 0)
    add_norm = StageCost(H * weight_bytes + 4 * T * H * F32, 5 * T * H)  # residual add fused with the next RMSNorm
    costs = {
        "embedding": StageCost(T * H * (weight_bytes + F32), 0),
        "input_norm": norm(T), "q": _plus(qkv, kv_write), "k": none, "v": none,
        "attn": attention, "o_proj": linear(T, q_width, H), "attn_residual": add_norm, "post_norm": none,
        "mlp": StageCost(mlp.bytes + down.bytes + 3 * T * I * F32, mlp.flops + down.flops + 4 * T * I),
        "output": add_norm, "final_norm": none, "logits": linear(logits_rows, H, V),
    }
    if fused:
        residual_add = StageCost(2 * T * H * F32, T * H)  # reads the residual, writes the sum
        costs.update({
            "input_norm": _plus(_plus(qkv, norm(T)), kv_write), "q": none,  # RoPE and the K/V write fused behind
            "o_proj": _plus(costs["o_proj"], residual_add), "attn_residual": none,
            # gate|up with the norm in front and silu(gate) * up behind: writes T x I, not T x 2I
            "post_norm": StageCost(mlp.bytes - T * I * F32 + norm(T).bytes, mlp.flops + 4 * T * I + norm(T).flops),
            "mlp": _plus(down, residual_add), "output": none, "final_norm": norm(T),
        })
    return costs


def _plus(a: StageCost, b: StageCost) -> StageCost:
    return StageCost(a.bytes + b.bytes, a.flops + b.flops)
