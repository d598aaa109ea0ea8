"""The kernel plan's choices against its table (tinyvllm/runner/kernel_plan.py), asked of a GPU's plan and of the
simulator's on any machine: choices only, nothing launched. Llama-3.2-1B's shapes; the default crossovers
(FAST_GEMV_MAX_TOKENS 2, matmul.MAX_COALESCED_TOKENS 32). The plans are batch-invariant by default
(KernelPlan.batch_invariant); GPU_DEPENDENT and BATCH_DEPENDENT are the GPU's and the simulator's plans with it off
(--no-batch-invariant)."""
from types import SimpleNamespace

import pytest

from tinyvllm.runner.kernel_plan import KernelPlan

HIDDEN, HEADS_WIDTH, INTERMEDIATE, KV_HEADS = 2048, 32 * 64, 8192, 8
LAYER_INPUTS = (HIDDEN, HEADS_WIDTH, INTERMEDIATE)
GPU, GPU_DEPENDENT = "gpu", "gpu, batch-dependent"
SIMULATOR, BATCH_DEPENDENT = "simulator", "simulator, batch-dependent"


def plan(precision: str, where: str) -> KernelPlan:
    return KernelPlan(precision, head_dim=64, group=4, simulator=where in (SIMULATOR, BATCH_DEPENDENT),
                      batch_invariant=where in (GPU, SIMULATOR))


def attention(p: KernelPlan, tokens: int, decode_only: bool) -> str:
    """The attention kernel's name for a step of `tokens` queries (one sequence each when decode_only)."""
    batch = SimpleNamespace(decode_only=decode_only, block_tables=None, positions=None, prefill_tiles=None,
                            query_seq=SimpleNamespace(shape=(tokens,)))
    return p.attention(batch, KV_HEADS, 0.125).name


@pytest.mark.parametrize("precision, simulator, rows, projection, fused_gemv_layer", [
    ("fp32", GPU, 1, "matmul.gemm_blocked (one pass)", False),   # invariant: one kernel, no split-K, no fusion
    ("fp32", GPU, 4096, "matmul.gemm_blocked (one pass)", False),
    ("fast", GPU, 1, "gemm_tc.gemm_tc", False),                   # the tensor cores for every row count
    ("fast", GPU, 4096, "gemm_tc.gemm_tc", False),
    ("fp32", GPU_DEPENDENT, 1, "matmul.gemv_coalesced", True),
    ("fp32", GPU_DEPENDENT, 32, "matmul.gemv_coalesced", True),
    ("fp32", GPU_DEPENDENT, 33, "matmul.gemm_blocked", False),
    ("fp32", GPU_DEPENDENT, 4096, "matmul.gemm_blocked", False),
    ("fast", GPU_DEPENDENT, 2, "matmul.gemv_coalesced", True),   # up to FAST_GEMV_MAX_TOKENS: the fused GEMVs
    ("fast", GPU_DEPENDENT, 3, "gemm_tc.gemm_tc", False),
    ("fast", GPU_DEPENDENT, 4096, "gemm_tc.gemm_tc", False),
    ("fp32", SIMULATOR, 1, "matmul.gemv", False),         # the simulator: gemv for everything on CUDA cores
    ("fp32", SIMULATOR, 4096, "matmul.gemv", False),
    ("fast", SIMULATOR, 1, "gemm_tc.gemm_tc", False),     # the tensor cores for every row count
    ("fast", BATCH_DEPENDENT, 1, "matmul.gemv", False),
    ("fast", BATCH_DEPENDENT, 2, "gemm_tc.gemm_tc", False),  # the tensor cores from 2 rows
])
def test_projections_and_the_layer_kind(precision, simulator, rows, projection, fused_gemv_layer):
    p = plan(precision, simulator)
    assert p.projection(rows, HIDDEN).name == projection
    assert p.fused_gemv_layer(rows, LAYER_INPUTS) == fused_gemv_layer
    assert (p.norm_bits_shape(rows, HIDDEN) is not None) == (projection == "gemm_tc.gemm_tc")


@pytest.mark.parametrize("precision, simulator, tokens, decode_only, kernel", [
    ("fp32", GPU, 1, True, "prefill_gqa.paged_attention_prefill_gqa"),  # invariant: decode as prefill
    ("fp32", GPU, 64, True, "prefill_gqa.paged_attention_prefill_gqa"),
    ("fp32", GPU, 4096, False, "prefill_gqa.paged_attention_prefill_gqa"),
    ("fast", GPU, 1, True, "prefill_tc.paged_attention_prefill_tc"),
    ("fast", GPU, 4096, False, "prefill_tc.paged_attention_prefill_tc"),
    ("fp32", GPU_DEPENDENT, 1, True, "decode_warps.paged_attention_flash_decode_warps"),  # under 64 (query, KV head)
    ("fp32", GPU_DEPENDENT, 7, True, "decode_warps.paged_attention_flash_decode_warps"),
    ("fp32", GPU_DEPENDENT, 8, True, "decode_gqa.paged_attention_decode_gqa"),
    ("fp32", GPU_DEPENDENT, 63, True, "decode_gqa.paged_attention_decode_gqa"),
    ("fp32", GPU_DEPENDENT, 64, True, "decode_warps.paged_attention_decode_warps"),  # from 512 pairs
    ("fast", GPU_DEPENDENT, 1, True, "decode_warps.paged_attention_flash_decode_warps"),  # both precisions alike
    ("fast", GPU_DEPENDENT, 64, True, "decode_warps.paged_attention_decode_warps"),
    ("fp32", GPU_DEPENDENT, 4096, False, "prefill_gqa.paged_attention_prefill_gqa"),
    ("fast", GPU_DEPENDENT, 4096, False, "prefill_tc.paged_attention_prefill_tc"),
    ("fp32", SIMULATOR, 1, True, "per_query.paged_attention_per_query"),
    ("fp32", SIMULATOR, 16, False, "per_query.paged_attention_per_query"),
    ("fast", SIMULATOR, 1, True, "prefill_tc.paged_attention_prefill_tc"),  # decode as prefill: one kernel
    ("fast", SIMULATOR, 16, False, "prefill_tc.paged_attention_prefill_tc"),  # tensor cores in the simulator too
    ("fast", BATCH_DEPENDENT, 1, True, "per_query.paged_attention_per_query"),
    ("fast", BATCH_DEPENDENT, 16, False, "prefill_tc.paged_attention_prefill_tc"),
])
def test_attention(precision, simulator, tokens, decode_only, kernel):
    assert attention(plan(precision, simulator), tokens, decode_only) == "attention." + kernel


def test_the_gate_runs_inside_gate_up_where_the_fast_plan_takes_it_in_one_pass():
    fused = "gemm_tc.gemm_tc (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)"
    assert plan("fast", GPU).gate(4096, HIDDEN, INTERMEDIATE).name == fused
    assert plan("fast", GPU).gate(1, HIDDEN, INTERMEDIATE).name == fused  # invariant: no split-K, so in one pass
    assert plan("fast", SIMULATOR).gate(16, HIDDEN, INTERMEDIATE).name == fused
    assert plan("fp32", GPU_DEPENDENT).gate(4096, HIDDEN, INTERMEDIATE).name == (
        "matmul.gemm_blocked (gate|up in one) + activation.silu_mul_gate_up")
    assert plan("fp32", SIMULATOR).gate(16, HIDDEN, INTERMEDIATE).name == (
        "matmul.gemv (gate|up in one) + activation.silu_mul_gate_up")
    assert plan("fast", GPU).swiglu(4096, INTERMEDIATE).name == "activation.silu_mul_gate_up (bf16)"


@pytest.mark.parametrize("where", [SIMULATOR, GPU])
@pytest.mark.parametrize("precision", ["fp32", "fast"])
def test_invariant_plans_choose_alike_for_every_row_count_and_step_kind(precision, where):
    """The plan-side half of tests/test_batch_invariance.py: one projection kernel, no split-K, no fused layer and
    one attention kernel whatever the step's rows and mix, and a decode-only step gets the query tiles its attention
    reads."""
    p = plan(precision, where)
    rows_seen = (1, 2, 3, 7, 33, 64, 512, 4096)
    assert len({p.projection(rows, k).name for rows in rows_seen for k in LAYER_INPUTS}) == 1
    assert not any(p.fused_gemv_layer(rows, LAYER_INPUTS) for rows in rows_seen)
    assert {p.tc_splits(rows, HIDDEN, INTERMEDIATE, p.tc_tile(rows, HIDDEN)) for rows in rows_seen} == {1}
    assert len({attention(p, tokens, decode_only) for tokens in rows_seen for decode_only in (True, False)}) == 1
    tiled = where == GPU or precision == "fast"  # the simulator's fp32 attention (per_query) takes no tiles
    assert p.tiled_decode == tiled


def test_the_batch_dependent_gpu_plan_splits_k_for_decode_batches():
    """What --no-batch-invariant keeps on a GPU: down_proj of a 64-row decode step splits K, a prefill does not."""
    p = plan("fast", GPU_DEPENDENT)
    assert p.tc_splits(64, HIDDEN, INTERMEDIATE, p.tc_tile(64, HIDDEN)) > 1
    assert p.tc_splits(4096, HIDDEN, INTERMEDIATE, p.tc_tile(4096, HIDDEN)) == 1
    assert not p.tiled_decode


def test_invariant_decode_steps_take_the_narrow_tile_which_the_swiglu_epilogue_accepts():
    from kernels_numba.gemm_tc import _gemm_tc_kernel
    from tinyvllm.runner.kernel_plan import INVARIANT_DECODE_TILE
    p, dependent = plan("fast", GPU), plan("fast", GPU_DEPENDENT)
    assert p.tc_tile(1, HIDDEN) == p.tc_tile(16, INTERMEDIATE) == INVARIANT_DECODE_TILE
    assert p.tc_tile(17, HIDDEN) == dependent.tc_tile(17, HIDDEN) and dependent.tc_tile(1, HIDDEN) != INVARIANT_DECODE_TILE
    _gemm_tc_kernel(INVARIANT_DECODE_TILE, residual=False, split=False, swiglu=True)  # its asserts hold for the tile


@pytest.mark.parametrize("where", [GPU, GPU_DEPENDENT])
def test_hopper_plans_take_large_steps_to_wgmma(where):
    """gemm_wgmma gives gemm_tc's bits (tests/test_wgmma.py), so the invariant plan may switch at WGMMA_MIN_ROWS too."""
    import dataclasses
    from tinyvllm.runner.kernel_plan import WGMMA_MIN_ROWS
    p = dataclasses.replace(plan("fast", where), wgmma=True)
    assert p.projection(WGMMA_MIN_ROWS - 1, HIDDEN).name == "gemm_tc.gemm_tc"
    assert p.projection(WGMMA_MIN_ROWS, HIDDEN).name == p.projection(4096, INTERMEDIATE).name == "gemm_wgmma.gemm_wgmma"
    assert p.gate(4096, HIDDEN, INTERMEDIATE).name == (
        "gemm_wgmma.gemm_wgmma (gate|up in one, silu(gate) * up behind: SwiGLUEpilogue, bf16)")
    assert p.gate(WGMMA_MIN_ROWS - 1, HIDDEN, INTERMEDIATE).name.startswith("gemm_tc.gemm_tc")
    fp32 = dataclasses.replace(plan("fp32", where), wgmma=True)
    assert "wgmma" not in fp32.projection(4096, HIDDEN).name


@pytest.mark.parametrize("where", [GPU, GPU_DEPENDENT])
def test_hopper_plans_run_the_tiled_attention_on_wgmma_over_a_bf16_pool(where):
    """prefill_wgmma gives prefill_tc's bits (tests/test_prefill_wgmma.py) and takes the same tiles: every step the
    tiled attention serves goes to it, whatever its rows and mix; a float32 pool, or a head_dim it cannot take, stays
    on prefill_tc."""
    import dataclasses
    hopper = dataclasses.replace(plan("fast", where), wgmma=True, bf16_kv=True)
    wgmma = "attention.prefill_wgmma.paged_attention_prefill_wgmma"
    assert attention(hopper, 4096, False) == attention(hopper, 7, False) == wgmma
    assert (attention(hopper, 1, True) == wgmma) == hopper.tiled_decode
    assert hopper.prefill_tile_queries() == plan("fast", where).prefill_tile_queries()
    for other in (dataclasses.replace(hopper, bf16_kv=False), dataclasses.replace(hopper, wgmma=False),
                  dataclasses.replace(hopper, head_dim=48)):
        assert attention(other, 4096, False) == "attention.prefill_tc.paged_attention_prefill_tc"
    assert "wgmma" not in attention(dataclasses.replace(plan("fp32", where), wgmma=True, bf16_kv=True), 4096, False)
