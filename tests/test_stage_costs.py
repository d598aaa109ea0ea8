"""The bytes and FLOPs each stage must move and do, checked against hand counts for a small config."""
import numpy as np

from tinyvllm.model.config import ModelConfig
from tinyvllm.runner.inputs import ForwardBatch
from tinyvllm.bench.stage_costs import stage_costs

CONFIG = ModelConfig.from_dict({"model_type": "llama", "vocab_size": 100, "hidden_size": 8, "intermediate_size": 12,
                                "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 2, "hidden_act": "silu"})


def test_a_two_sequence_step_costs_what_the_counts_say():
    # sequence 0: a 3-token prefill (positions 0..2); sequence 1: one decode token at position 5
    batch = ForwardBatch(token_ids=[1, 2, 3, 4], positions=[0, 1, 2, 5], query_seq=[0, 0, 0, 1],
                         slot_mapping=[0, 1, 2, 9], block_tables=np.array([[0], [1]]), logits_rows=[2, 3])
    costs = stage_costs(CONFIG, batch, logits_rows=2)
    T, H, I, V = 4, 8, 12, 100
    q_width, kv_width = 4 * 2, 2 * 2
    qkv_width = q_width + 2 * kv_width  # q, k and v are one projection
    assert costs["q"].flops == 2 * T * H * qkv_width
    assert costs["q"].bytes == qkv_width * H * 2 + T * (H + qkv_width) * 4 + T * 2 * kv_width * 4  # + K/V write
    assert costs["k"].bytes == costs["post_norm"].flops == 0
    assert costs["output"].bytes == H * 2 + 4 * T * H * 4  # reads m, h; writes h, x; one norm weight
    assert costs["logits"].flops == 2 * 2 * H * V
    # keys: sequence 0 holds 3, sequence 1 holds 6; each K and V row is kv_width float32
    assert costs["attn"].bytes == (3 + 6) * kv_width * 2 * 4 + T * 2 * q_width * 4
    assert costs["attn"].flops == 4 * (1 + 2 + 3 + 6) * q_width
    assert costs["mlp"].flops == 2 * T * H * 2 * I + 2 * T * I * H + 4 * T * I
    assert costs["input_norm"].bytes == H * 2 + 2 * T * H * 4


def test_the_fused_layer_counts_each_launch_where_it_runs():
    batch = ForwardBatch(token_ids=[1, 2], positions=[4, 7], query_seq=[0, 1], slot_mapping=[4, 11],
                         block_tables=np.array([[0, 1], [2, 3]]), logits_rows=[0, 1])
    plain = stage_costs(CONFIG, batch, logits_rows=2)
    fused = stage_costs(CONFIG, batch, logits_rows=2, fused=True)
    T, H, I = 2, 8, 12
    qkv_width = 4 * 2 + 2 * 2 * 2
    # norm + q|k|v + RoPE + the K/V write in one launch: the two plain stages' counts (q, k and v written
    # where the plain projection writes q|k|v, the same bytes; rope counts no FLOPs)
    assert fused["input_norm"].flops == plain["input_norm"].flops + plain["q"].flops
    assert fused["input_norm"].bytes == plain["input_norm"].bytes + plain["q"].bytes
    assert fused["input_norm"].bytes == (qkv_width * H * 2 + T * (H + qkv_width) * 4 + T * 2 * 2 * 2 * 4
                                         + H * 2 + 2 * T * H * 4)
    assert fused["q"].bytes == fused["q"].flops == 0
    assert fused["o_proj"].bytes == plain["o_proj"].bytes + 2 * T * H * 4  # + reading h, writing h + o
    assert fused["attn_residual"].bytes == fused["output"].flops == 0
    assert fused["post_norm"].flops == 2 * T * H * 2 * I + 4 * T * I + 4 * T * H  # gate|up, silu * up, norm
    assert fused["post_norm"].bytes == 2 * I * H * 2 + T * (H + I) * 4 + H * 2 + 2 * T * H * 4
    assert fused["mlp"].flops == 2 * T * I * H + T * H
    assert fused["final_norm"] == plain["input_norm"] and fused["attn"] == plain["attn"]


def test_float32_weights_count_four_bytes_a_weight():
    batch = ForwardBatch(token_ids=[1, 2], positions=[0, 1], query_seq=[0, 0], slot_mapping=[0, 1],
                         block_tables=np.array([[0]]), logits_rows=[1])
    bf16, f32 = stage_costs(CONFIG, batch, 1), stage_costs(CONFIG, batch, 1, weight_bytes=4)
    H, I, V, qkv_width = 8, 12, 100, 4 * 2 + 2 * 2 * 2
    assert f32["q"].bytes - bf16["q"].bytes == 2 * qkv_width * H   # the weights' second two bytes
    assert f32["mlp"].bytes - bf16["mlp"].bytes == 2 * 3 * I * H
    assert f32["logits"].bytes - bf16["logits"].bytes == 2 * V * H and f32["q"].flops == bf16["q"].flops
    assert f32["embedding"].bytes - bf16["embedding"].bytes == 2 * 2 * H   # the two rows gathered
    from tinyvllm.bench import weight_bytes
    assert weight_bytes(CONFIG, 4) == 2 * weight_bytes(CONFIG)


def test_a_bf16_kv_pool_counts_two_bytes_a_cached_element():
    batch = ForwardBatch(token_ids=[1, 2], positions=[5, 1], query_seq=[0, 1], slot_mapping=[5, 17],
                         block_tables=np.array([[0], [1]]), logits_rows=[0, 1])
    f32, bf16 = stage_costs(CONFIG, batch, 2), stage_costs(CONFIG, batch, 2, kv_element_bytes=2)
    kv_width = 2 * 2  # n_kv_heads x head_dim
    assert f32["attn"].bytes - bf16["attn"].bytes == (6 + 2) * kv_width * 2 * 2  # K and V of 8 cached tokens
    assert f32["q"].bytes - bf16["q"].bytes == 2 * kv_width * 2 * 2  # 2 tokens' k and v stored
    assert f32["attn"].flops == bf16["attn"].flops
