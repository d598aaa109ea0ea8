"""The kernel plan's choices against its table (tinyvllm/runner/kernel_plan.py), asked of a GPU's plan and of the
simulator's on any machine: choices only, nothing launched. Llama-3.2-1B's shapes; the default crossovers
(FAST_GEMV_MAX_TOKENS 2, matmul.MAX_COALESCED_TOKENS 32)."""
from types import SimpleNamespace

import pytest

from tinyvllm.runner.kernel_plan import KernelPlan

HIDDEN, HEADS_WIDTH, INTERMEDIATE, KV_HEADS = 2048, 32 * 64, 8192, 8
LAYER_INPUTS = (HIDDEN, HEADS_WIDTH, INTERMEDIATE)
GPU, SIMULATOR = False, True


def plan(precision: str, simulator: bool) -> KernelPlan:
    return KernelPlan(precision, head_dim=64, group=4, simulator=simulator)


def attention(p: KernelPlan, tokens: int, decode_only: bool) -> str:
    """The attention kernel's name for a step of `tokens` queries (one sequence each when decode_only)."""
    batch = SimpleNamespace(decode_only=decode_only, block_tables=None, positions=None, prefill_tiles=None,
                            query_seq=SimpleNamespace(shape=(tokens,)))
    return p.attention(batch, KV_HEADS, 0.125).name


@pytest.mark.parametrize("precision, simulator, rows, projection, fused_gemv_layer", [
    ("fp32", GPU, 1, "matmul.gemv_coalesced", True),
    ("fp32", GPU, 32, "matmul.gemv_coalesced", True),
    ("fp32", GPU, 33, "matmul.gemm_blocked", False),
    ("fp32", GPU, 4096, "matmul.gemm_blocked", False),
    ("fast", GPU, 2, "matmul.gemv_coalesced", True),     # up to FAST_GEMV_MAX_TOKENS: the fused GEMVs
    ("fast", GPU, 3, "gemm_tc.gemm_tc", False),
    ("fast", GPU, 4096, "gemm_tc.gemm_tc", False),
    ("fp32", SIMULATOR, 1, "matmul.gemv", False),         # the simulator: gemv for everything on CUDA cores
    ("fp32", SIMULATOR, 4096, "matmul.gemv", False),
    ("fast", SIMULATOR, 1, "matmul.gemv", False),
    ("fast", SIMULATOR, 2, "gemm_tc.gemm_tc", False),     # the tensor cores from 2 rows
])
def test_projections_and_the_layer_kind(precision, simulator, rows, projection, fused_gemv_layer):
    p = plan(precision, simulator)
    assert p.projection(rows, HIDDEN).name == projection
    assert p.fused_gemv_layer(rows, LAYER_INPUTS) == fused_gemv_layer
    assert (p.norm_bits_shape(rows, HIDDEN) is not None) == (projection == "gemm_tc.gemm_tc")


@pytest.mark.parametrize("precision, simulator, tokens, decode_only, kernel", [
    ("fp32", GPU, 1, True, "decode_gqa.paged_attention_flash_decode"),   # under 64 (query, KV head) pairs
    ("fp32", GPU, 7, True, "decode_gqa.paged_attention_flash_decode"),
    ("fp32", GPU, 8, True, "decode_gqa.paged_attention_decode_gqa"),
    ("fp32", GPU, 63, True, "decode_gqa.paged_attention_decode_gqa"),
    ("fp32", GPU, 64, True, "decode_warps.paged_attention_decode_warps"),  # from 512 pairs
    ("fast", GPU, 1, True, "decode_gqa.paged_attention_flash_decode"),   # decode: both precisions alike
    ("fast", GPU, 64, True, "decode_warps.paged_attention_decode_warps"),
    ("fp32", GPU, 4096, False, "prefill_gqa.paged_attention_prefill_gqa"),
    ("fast", GPU, 4096, False, "prefill_tc.paged_attention_prefill_tc"),
    ("fp32", SIMULATOR, 1, True, "per_query.paged_attention_per_query"),
    ("fp32", SIMULATOR, 16, False, "per_query.paged_attention_per_query"),
    ("fast", SIMULATOR, 1, True, "per_query.paged_attention_per_query"),
    ("fast", SIMULATOR, 16, False, "prefill_tc.paged_attention_prefill_tc"),  # tensor cores in the simulator too
])
def test_attention(precision, simulator, tokens, decode_only, kernel):
    assert attention(plan(precision, simulator), tokens, decode_only) == "attention." + kernel


def test_the_gate_runs_inside_gate_up_where_the_fast_plan_takes_it_in_one_pass():
    fused = "gemm_tc.gemm_tc (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)"
    assert plan("fast", GPU).gate(4096, HIDDEN, INTERMEDIATE).name == fused
    assert plan("fast", SIMULATOR).gate(16, HIDDEN, INTERMEDIATE).name == fused
    assert plan("fp32", GPU).gate(4096, HIDDEN, INTERMEDIATE).name == (
        "matmul.gemm_blocked (gate|up in one) + activation.silu_mul_gate_up")
    assert plan("fp32", SIMULATOR).gate(16, HIDDEN, INTERMEDIATE).name == (
        "matmul.gemv (gate|up in one) + activation.silu_mul_gate_up")
    assert plan("fast", GPU).swiglu(4096, INTERMEDIATE).name == "activation.silu_mul_gate_up (bf16)"
