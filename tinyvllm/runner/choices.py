"""The device-side settings a user picks by name, each name list defined once: the precision (--precision,
EngineConfig.precision) and the KV cache's element type (--kv-cache-dtype, EngineConfig.kv_cache_dtype).

Free of kernel imports: whatever names them (the CLI's flags, BenchConfig) loads no numba for it.
kernel_plan.resolve_precision turns a precision into what runs, kv_pool.resolve_kv_cache_dtype does the same for
the KV cache (kernels_numba.kv_dtype's KV_DTYPES: how the pool stores each name).
"""
from __future__ import annotations

from tinyvllm.errors import TinyVLLMError

PRECISIONS = ("auto", "fp32", "fast")      # what each runs: tinyvllm/runner/kernel_plan.py
KV_CACHE_DTYPES = ("float32", "bfloat16")  # the pool's element types
KV_CACHE_DTYPE_CHOICES = ("auto",) + KV_CACHE_DTYPES  # auto: bfloat16 with the fast precision, else float32


def check_precision(requested: str, setting: str = "invalid engine setting: precision") -> None:
    """A one-line TinyVLLMError, `setting` first, unless `requested` is one of PRECISIONS."""
    if requested not in PRECISIONS:
        raise TinyVLLMError(f"{setting} must be one of {', '.join(PRECISIONS)}, got {requested!r}")


def check_kv_cache_dtype(requested: str, setting: str = "invalid engine setting: kv_cache_dtype") -> None:
    """A one-line TinyVLLMError, `setting` first, unless `requested` is one of KV_CACHE_DTYPE_CHOICES."""
    if requested not in KV_CACHE_DTYPE_CHOICES:
        raise TinyVLLMError(f"{setting} must be auto or one of {', '.join(KV_CACHE_DTYPES)}, got {requested!r}")


def add_precision_arguments(group) -> None:
    """--kv-cache-dtype and --precision, for every command that builds an engine (cli's engine options, bench)."""
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPE_CHOICES, default="auto",
                       help="KV cache elements: float32 (the reference) or bfloat16 (half the memory and bytes "
                            "read); auto (default): bfloat16 with the fast precision, else float32")
    group.add_argument("--precision", choices=PRECISIONS, default="auto",
                       help="fp32: float32 activations (the reference); fast: bf16 activations into tensor cores, "
                            "float32 accumulation; auto (default): fast on a GPU with bf16 weights, else fp32")
