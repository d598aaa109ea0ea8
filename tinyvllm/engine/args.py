"""The engine's command-line flags, defined once for every command that builds an engine (generate,
check-goldens, eval, serve, debug, trace), and the EngineConfig / LLMEngine they describe.

    add_engine_arguments(parser)        # --model and the "engine" group
    engine = build_engine(parser.parse_args())

The engine module is imported inside the functions: parsing a command line loads no numba.
"""
from __future__ import annotations

from tinyvllm.runner.choices import add_precision_arguments


def add_engine_arguments(parser) -> None:
    """--model, then the "engine" group: batching, the KV pool, precision."""
    parser.add_argument("--model", metavar="DIR", help="HF Llama model directory, or a .gguf file (or a directory "
                                                       "holding one) (default: the demo model)")
    e = parser.add_argument_group("engine")
    e.add_argument("--max-model-len", type=int, metavar="N", help="longest prompt + output (default: min(4096, model's))")
    e.add_argument("--max-num-seqs", type=int, default=8, metavar="N", help="sequences in flight per step")
    e.add_argument("--max-num-batched-tokens", type=int, default=512, metavar="N", help="token budget per step")
    e.add_argument("--block-size", type=int, default=16, metavar="N", help="tokens per KV block")
    e.add_argument("--num-blocks", type=int, metavar="N",
                   help="KV blocks in the pool (default: max-num-seqs x max-model-len, capped by memory)")
    e.add_argument("--gpu-memory-fraction", type=float, default=0.5, metavar="F",
                   help="share of free GPU memory for the KV pool when --num-blocks is not given")
    e.add_argument("--batching", choices=("continuous", "static"), default="continuous",
                   help="continuous: requests join and leave every step; static: a batch runs to completion")
    e.add_argument("--no-chunked-prefill", action="store_true",
                   help="prefill each prompt in one step (default: chunks within the token budget)")
    e.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV blocks of shared prefixes")
    e.add_argument("--compile-workers", type=int, metavar="N",
                   help="processes compiling the CUDA-graph steps' kernels at a first start (default: the CPU cores, "
                        "at most 16; 0: each compiles at its first launch)")
    add_precision_arguments(e)
    invariance = e.add_mutually_exclusive_group()
    invariance.add_argument("--batch-invariant", dest="batch_invariant", action="store_true", default=None,
                            help="a request's tokens and logprobs, bit for bit, whatever shares its steps (default: on, "
                                 "except generate, serve and bench in the fast precision on a GPU, where it costs "
                                 "speed: docs/batch-invariance.md)")
    invariance.add_argument("--no-batch-invariant", dest="batch_invariant", action="store_false",
                            help="let the kernel choices follow each step's rows, everywhere")


def engine_config_from_args(args, reference: bool = False, **overrides):
    """The EngineConfig the engine flags describe; `overrides` replace single fields. `reference`: a command whose
    runs are compared with others (check-goldens, eval, debug, trace), batch-invariant unless --no-batch-invariant
    (elsewhere EngineConfig's default decides)."""
    from tinyvllm.engine.engine import EngineConfig
    fields = dict(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, num_blocks=args.num_blocks, gpu_memory_fraction=args.gpu_memory_fraction,
        max_model_len=args.max_model_len, chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching, batching=args.batching,
        kv_cache_dtype=args.kv_cache_dtype, precision=args.precision, compile_workers=args.compile_workers,
        batch_invariant=True if reference and args.batch_invariant is None else args.batch_invariant)
    return EngineConfig(**(fields | overrides))


def build_engine(args, config=None, reference: bool = False, **engine_options):
    """An LLMEngine on --model with `config` (default: engine_config_from_args(args, reference)); `engine_options`
    go to LLMEngine (e.g. log)."""
    from tinyvllm.engine.engine import LLMEngine
    return LLMEngine(args.model, config or engine_config_from_args(args, reference), **engine_options)
