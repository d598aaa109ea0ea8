"""EngineConfig: how an engine batches, pages its KV cache and runs its steps; validated on construction.

The engine's command-line flags (args.py) fill it; the scheduler reads its batching fields, the runner
(ModelRunner.for_engine) the device ones: precision, KV cache dtype and size, CUDA graphs.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyvllm.errors import TinyVLLMError
from tinyvllm.runner.choices import check_kv_cache_dtype, check_precision

DEFAULT_MAX_MODEL_LEN = 4096


@dataclass
class EngineConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512     # token budget of one step
    block_size: int = 16
    num_blocks: int | None = None         # None: what max_num_seqs x max_model_len can use, capped by
    #                                       gpu_memory_fraction of the free GPU memory (kv_pool.default_num_blocks)
    gpu_memory_fraction: float = 0.5
    max_model_len: int | None = None      # None: min(max_position_embeddings, 4096)
    chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    batching: str = "continuous"          # or "static": a batch runs to completion before the next
    cuda_graphs: bool | None = None       # replay decode steps from CUDA graphs; None: on a GPU only
    prefill_graphs: bool | None = None    # replay steps with prefill chunks from CUDA graphs (prefill_graphs.py);
    #                                       None: as cuda_graphs (so on a GPU only, unless that is set)
    pipeline_decode: bool = True          # with graphs: launch an all-greedy decode step before reading the
    #                                       previous one's tokens back (runner/step.py)
    kv_cache_dtype: str = "auto"          # "float32", "bfloat16" (kv_pool.KVPool), or "auto": bfloat16 with the
    #                                       fast precision, float32 with fp32 (kv_pool.resolve_kv_cache_dtype)
    precision: str = "auto"               # "fp32" (the reference), "fast" (bf16 activations into tensor cores),
    #                                       "auto": fast on a GPU with bf16 weights (kernel_plan.resolve_precision)
    batch_invariant: bool | None = None   # a request's tokens and logprobs whatever shares its steps
    #                                       (KernelPlan.batch_invariant, docs/batch-invariance.md); None: on, except
    #                                       the fast precision on a GPU (invariant_for)
    compile_workers: int | None = None    # processes compiling the CUDA-graph steps' kernels at a first start
    #                                       (runner/compile_workers.py); None: the CPU cores (at most 16); 0 or 1:
    #                                       none, each kernel compiles at its first launch

    def __post_init__(self):
        def check(ok, message):
            if not ok:
                raise TinyVLLMError(f"invalid engine setting: {message}")
        check(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        check(self.max_num_batched_tokens >= 1, f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.num_blocks is None or self.num_blocks >= 1, f"num_blocks must be >= 1, got {self.num_blocks}")
        check(0 < self.gpu_memory_fraction <= 1, f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        check(self.max_model_len is None or self.max_model_len >= 2, f"max_model_len must be >= 2, got {self.max_model_len}")
        check(self.batching in ("continuous", "static"), f"batching must be continuous or static, got {self.batching!r}")
        check(self.batch_invariant is None or type(self.batch_invariant) is bool,
              f"batch_invariant must be True, False or None, got {self.batch_invariant!r}")
        check(self.compile_workers is None or self.compile_workers >= 0,
              f"compile_workers must be >= 0, got {self.compile_workers}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        check_precision(self.precision)

    def invariant_for(self, precision: str, simulator: bool) -> bool:
        """Whether the engine's kernel plan is batch-invariant at a resolved precision: batch_invariant, or where it
        is None, everywhere but the fast precision on a GPU (there it costs decode speed: docs/batch-invariance.md)."""
        if self.batch_invariant is not None:
            return self.batch_invariant
        return precision != "fast" or simulator

    def max_model_len_for(self, max_position_embeddings: int) -> int:
        """The longest prompt + output this engine runs on a model of that context: max_model_len (default
        DEFAULT_MAX_MODEL_LEN), capped by the model's."""
        return min(self.max_model_len or DEFAULT_MAX_MODEL_LEN, max_position_embeddings)
