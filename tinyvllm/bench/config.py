"""The benchmark's settings: BenchConfig, its command-line flags, and the command that reproduces a run."""
from __future__ import annotations

import argparse
import dataclasses
import shlex
from dataclasses import dataclass

from tinyvllm.runner.choices import add_precision_arguments, check_precision
from tinyvllm.errors import TinyVLLMError

WORKLOADS = ("latency", "prefill", "throughput", "serving", "kernels")
BATCHING_MODES = ("continuous", "static")
HTTP_WORKLOADS = ("serving", "throughput")   # what --base-url sends to a server
# --batch-invariant: the runs it makes (EngineConfig.batch_invariant; auto: its default, off only for fast on a GPU)
INVARIANCE_CHOICES = {"auto": (None,), "on": (True,), "off": (False,), "both": (True, False)}
PROMPT_FORMATS = ("ids", "text")
PROMPT_ID_LIMIT = 10_000      # nano-vllm draws prompt ids from [0, 10000]
PROGRESS_EVERY_S = 10.0
SIMULATOR_COPY_BYTES = 1 << 20
KERNEL_STEPS = 2  # the latency prompt's prefill, then one decode step
# The serving latencies the report prints for a --base-url run (http_runs.py), as `vllm bench serve`
# names them: (key, short name, long name).
LATENCIES = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))


@dataclass
class BenchConfig:
    model: str | None = None              # None: the demo model
    random_1b: str | None = None          # write (once) and use a random Llama-3.2-1B-shaped model here
    workloads: tuple[str, ...] = WORKLOADS
    out: str = "out/bench"
    seed: int = 0
    max_seconds: float = 300.0            # per run (one workload on one system, one batching mode)
    latency_prompt: int = 128
    latency_new_tokens: int = 256
    prefill_lens: tuple[int, ...] = (128, 1024, 4096)
    prefill_repeats: int = 3
    num_requests: int = 256
    min_len: int = 100
    max_len: int = 1024
    min_output_len: int | None = None     # None: min_len (nano-vllm uses one range for both)
    max_output_len: int | None = None
    batching: tuple[str, ...] = BATCHING_MODES
    serving_requests: int = 100
    request_rate: float = 4.0             # requests/s; inf: all at once
    compare: str | None = None            # "hf"
    hf_only: bool = False                 # only the HF side (e.g. on a second GPU beside a tinyvllm run)
    hf_batch_size: int = 64
    hf_device: str = "cuda"
    copy_mib: int = 1024
    plot: bool = True
    warmup: bool = True
    # engine
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_fraction: float = 0.5
    max_model_len: int | None = None      # None: what the workloads need, capped by the model
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"          # float32, bfloat16, or auto: bfloat16 with the fast precision
    precision: str = "auto"               # EngineConfig.precision: auto, fp32 or fast
    batch_invariant: str = "auto"         # EngineConfig.batch_invariant: auto, on, off, or both (each workload twice)
    # a running server instead of an in-process engine (http_runs.py)
    base_url: str | None = None           # e.g. http://127.0.0.1:8000
    max_concurrency: int | None = None    # requests in flight at most (None: no limit)
    prompt_as: str = "ids"                # send prompts as token ids or as their decoded text
    check_greedy: bool = False            # compare served outputs with offline LLM.generate

    def __post_init__(self):
        def check(ok, message):
            if not ok:
                raise TinyVLLMError(f"bench: {message}")
        check(not (self.model and self.random_1b), "give --model or --random-1b, not both")
        unknown = sorted(set(self.workloads) - set(WORKLOADS))
        check(self.workloads and not unknown, f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
        unknown = sorted(set(self.batching) - set(BATCHING_MODES))
        check(self.batching and not unknown, f"unknown batching mode(s) {unknown}; choose from continuous, static")
        check(self.compare in (None, "hf"), f"--compare takes hf, got {self.compare!r}")
        check_precision(self.precision, "bench: --precision")
        check(self.batch_invariant in INVARIANCE_CHOICES,
              f"--batch-invariant takes auto, on, off or both, got {self.batch_invariant!r}")
        check(not self.hf_only or self.compare == "hf", "--hf-only needs --compare hf")
        for name in ("latency_prompt", "latency_new_tokens", "prefill_repeats", "num_requests", "min_len",
                     "serving_requests", "hf_batch_size", "copy_mib", "max_num_seqs", "max_num_batched_tokens",
                     "block_size"):
            check(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        check(all(n >= 1 for n in self.prefill_lens) and self.prefill_lens, "--prefill-lens must be integers >= 1")
        check(self.min_len <= self.max_len, f"--min-len {self.min_len} > --max-len {self.max_len}")
        check(1 <= self.output_range[0] <= self.output_range[1], f"output length range {self.output_range} is empty")
        check(self.max_seconds > 0, f"--max-seconds must be > 0, got {self.max_seconds}")
        check(self.request_rate > 0, f"--request-rate must be > 0 (inf: all at once), got {self.request_rate}")
        check(self.max_concurrency is None or self.max_concurrency >= 1,
              f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        check(self.prompt_as in PROMPT_FORMATS, f"--prompt-as takes ids or text, got {self.prompt_as!r}")
        if self.base_url is None:
            check(self.max_concurrency is None and not self.check_greedy and self.prompt_as == "ids",
                  "--max-concurrency, --prompt-as and --check-greedy go with --base-url")
            return
        check(self.base_url.startswith(("http://", "https://")),
              f"--base-url must start with http:// or https://, got {self.base_url!r}")
        others = sorted(set(self.workloads) - set(HTTP_WORKLOADS))
        check(not others, f"--base-url sends the serving and throughput workloads to a server, not {others}: "
                          "add --workload serving (or throughput, or both)")
        check(self.compare is None, "--compare hf does not go with --base-url")
        check(self.batch_invariant == "auto", "--batch-invariant is the in-process engine's; a server takes "
                                            "its own (tinyvllm serve --batch-invariant)")
        check(not (self.check_greedy and self.prompt_as == "text"),
              "--check-greedy needs --prompt-as ids (a decoded prompt may not encode back to the same ids)")

    @property
    def invariance_modes(self) -> tuple[bool, ...]:
        """EngineConfig.batch_invariant of each run of a tinyvllm workload, in run order."""
        return INVARIANCE_CHOICES[self.batch_invariant]

    @property
    def output_range(self) -> tuple[int, int]:
        return (self.min_output_len or self.min_len, self.max_output_len or self.max_len)

    def needed_model_len(self) -> int:
        """The longest prompt + output any selected workload asks for."""
        needs = {"latency": self.latency_prompt + self.latency_new_tokens, "prefill": max(self.prefill_lens) + 1,
                 "throughput": self.max_len + self.output_range[1], "serving": self.max_len + self.output_range[1],
                 "kernels": self.latency_prompt + KERNEL_STEPS}
        return max(needs[w] for w in self.workloads)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    m = p.add_mutually_exclusive_group()
    m.add_argument("--model", metavar="DIR", help="HF Llama model directory (default: the demo model)")
    m.add_argument("--random-1b", metavar="DIR",
                   help="a random Llama-3.2-1B-shaped model in DIR, written first if DIR has none")
    p.add_argument("--workload", dest="workloads", type=_name_list, default=d.workloads, metavar="LIST",
                   help=f"comma-separated, from {','.join(WORKLOADS)} (default: all)")
    p.add_argument("--out", default=d.out, metavar="DIR", help="where bench.json/.csv/.png go (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the random prompts, lengths and arrivals")
    p.add_argument("--max-seconds", type=float, default=d.max_seconds, metavar="S",
                   help="stop each run (workload x system x batching mode) after S seconds (default: %(default)s)")
    p.add_argument("--compare", choices=("hf",), help="also run HF transformers (bf16 generate) on the same GPU")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="only merge these bench.json files (e.g. a tinyvllm run and an --hf-only run) into --out")
    p.add_argument("--hf-only", action="store_true",
                   help="run only the HF side of --compare hf (e.g. on a second GPU beside a tinyvllm run)")
    p.add_argument("--hf-batch-size", type=int, default=d.hf_batch_size, metavar="N",
                   help="HF throughput: requests per static batch")
    p.add_argument("--hf-device", default=d.hf_device, help="cpu: a slow dry run of the HF path (default: cuda)")
    p.add_argument("--copy-mib", type=int, default=d.copy_mib, metavar="MIB",
                   help="size of the bandwidth-measuring copy (default: %(default)s)")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="no PNG chart even with matplotlib")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up (timings then include numba's compilation; for quick checks)")
    w = p.add_argument_group("workload sizes")
    w.add_argument("--latency-prompt", type=int, default=d.latency_prompt, metavar="N", help="latency: prompt tokens")
    w.add_argument("--latency-new-tokens", type=int, default=d.latency_new_tokens, metavar="N",
                   help="latency: new tokens")
    w.add_argument("--prefill-lens", type=_int_list, default=d.prefill_lens, metavar="LIST",
                   help="prefill: comma-separated prompt lengths")
    w.add_argument("--prefill-repeats", type=int, default=d.prefill_repeats, metavar="N",
                   help="prefill: runs per length (the median is reported)")
    w.add_argument("--num-requests", type=int, default=d.num_requests, metavar="N", help="throughput requests")
    w.add_argument("--min-len", type=int, default=d.min_len, metavar="N", help="prompt (and output) length range")
    w.add_argument("--max-len", type=int, default=d.max_len, metavar="N", help="upper end of --min-len's range")
    w.add_argument("--min-output-len", type=int, metavar="N", help="output length range (default: --min/max-len)")
    w.add_argument("--max-output-len", type=int, metavar="N", help="upper end of --min-output-len's range")
    w.add_argument("--batching", type=_name_list, default=d.batching, metavar="LIST",
                   help="throughput modes (default: continuous,static)")
    w.add_argument("--serving-requests", type=int, default=d.serving_requests, metavar="N",
                   help="serving: requests")
    w.add_argument("--request-rate", type=float, default=d.request_rate, metavar="R",
                   help="serving arrivals per second, Poisson (inf: all at once; default: %(default)s)")
    e = p.add_argument_group("engine")
    e.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, metavar="N",
                   help="sequences in flight; static batching runs batches of this size (default: %(default)s)")
    e.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens, metavar="N",
                   help="token budget per step")
    e.add_argument("--block-size", type=int, default=d.block_size, metavar="N", help="tokens per KV block")
    e.add_argument("--num-blocks", type=int, metavar="N", help="KV blocks (default: from free GPU memory)")
    e.add_argument("--gpu-memory-fraction", type=float, default=d.gpu_memory_fraction, metavar="F",
                   help="share of free GPU memory for the KV pool when --num-blocks is not given")
    e.add_argument("--max-model-len", type=int, metavar="N", help="default: what the workloads need")
    e.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="do not reuse KV blocks of shared prefixes")
    add_precision_arguments(e)  # defaults auto, as BenchConfig's
    e.add_argument("--batch-invariant", choices=tuple(INVARIANCE_CHOICES), default=d.batch_invariant,
                   help="the engine's batch invariance (docs/batch-invariance.md); both: every tinyvllm workload "
                        "twice, on then off, on the same prompts, with on/off ratios (default: %(default)s)")
    h = p.add_argument_group("a running server (--base-url): the serving / throughput workloads over HTTP")
    h.add_argument("--base-url", metavar="URL",
                   help="an OpenAI-compatible server (tinyvllm serve, vLLM): send the workloads there as streamed "
                        "/v1/completions; --model names the server's model dir (vocabulary, --check-greedy)")
    h.add_argument("--max-concurrency", type=int, metavar="N", help="requests in flight at most (default: no limit)")
    h.add_argument("--prompt-as", choices=PROMPT_FORMATS, default=d.prompt_as,
                   help="send prompts as token ids or as decoded text (default: %(default)s)")
    h.add_argument("--check-greedy", action="store_true",
                   help="then run offline LLM.generate on the same prompts: served outputs must be identical")


_FLAGS = {"workloads": "--workload", "enable_prefix_caching": "--no-prefix-caching", "plot": "--no-plot",
          "warmup": "--no-warmup"}


def command_line(cfg: BenchConfig) -> str:
    """The command that reproduces this configuration (flags for what differs from the defaults)."""
    default, parts = BenchConfig(), ["tinyvllm", "bench"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        flag = _FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):        # its flag turns a default True off (--check-greedy: on)
            parts.append(flag)
        else:
            parts += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return shlex.join(parts)


def config_from_args(args) -> BenchConfig:
    return BenchConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)})
