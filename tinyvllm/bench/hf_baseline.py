"""The same workloads through HF transformers (bf16 `generate`) on the same GPU and weights."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from tinyvllm.errors import TinyVLLMError
from tinyvllm.bench.workloads import Workloads
from tinyvllm.bench.engine_runs import latency_key, prefill_row


def check_hf_available(device: str) -> None:
    """Fail before any work when --compare hf cannot run."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise TinyVLLMError(f"--compare hf needs torch and transformers (pip install -e '.[goldens]'), "
                            f"and a CUDA GPU: {e}") from e
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TinyVLLMError("--compare hf needs a CUDA GPU: torch sees none. HF transformers runs in bf16 on "
                            "the same GPU as tinyvllm; --hf-device cpu gives a slow functional dry run only")


@dataclass
class HFGeneration:
    seconds: float
    new_tokens: int          # generate steps run (every row of the batch gets this many)
    stopped_early: bool
    token_times: list[float]  # seconds from the start to each step's token, device-synchronised

    @property
    def ttft(self) -> float:
        return self.token_times[0]

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None


class HFBaseline:
    """HF transformers' LlamaForCausalLM in bf16 on the tinyvllm model's own weights, driven by `generate`."""

    def __init__(self, model_dir: Path, device: str, log):
        import torch
        import transformers
        self.torch, self.device = torch, torch.device(device)
        start = time.perf_counter()
        self.model = load_hf_bf16(model_dir, self.device)
        self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"
        self.eos_ids = self.model.config.eos_token_id
        log(f"HF {self.version}: bf16 {self.model.config._attn_implementation} on {device}, "
            f"loaded in {time.perf_counter() - start:.1f} s")

    def clock(self) -> float:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def generate(self, prompts: list[list[int]], new_tokens: int, deadline: float) -> HFGeneration:
        """Greedy, exactly `new_tokens` per row (EOS suppressed until then), left padded; stops at deadline.
        A stopping criterion, which generate calls after every new token, clocks each step."""
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1

        token_times = []

        class ClockAndDeadline(StoppingCriteria):
            def __call__(criterion, input_ids, scores, **kwargs):
                now = self.clock()
                token_times.append(now - start)
                return torch.full((input_ids.shape[0],), now >= deadline, dtype=torch.bool, device=input_ids.device)

        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                  pad_token_id=0, eos_token_id=self.eos_ids)
        ids, mask = ids.to(self.device), mask.to(self.device)
        start = self.clock()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                      stopping_criteria=StoppingCriteriaList([ClockAndDeadline()]))
        seconds = self.clock() - start
        made = out.shape[1] - width
        assert len(token_times) == made, (len(token_times), made)
        return HFGeneration(seconds, made, made < new_tokens, token_times)

    def warm_up(self, log) -> None:
        start = time.perf_counter()
        self.generate([list(range(1, 11)), [3, 1, 4]], 3, math.inf)
        self.generate([[3, 1, 4, 1, 5]], 3, math.inf)
        log(f"HF warm-up {time.perf_counter() - start:.1f} s")


def load_hf_bf16(model_dir: Path, device):
    """goldens/hf_reference.py's load_hf_model with bf16 in place of float32 (sdpa attention, HF's default
    fast path): built from the config, weights loaded by hand, embeddings tied when the checkpoint ties them."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM
    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "sdpa"
    try:
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = LlamaForCausalLM._from_config(config, torch_dtype=torch.bfloat16)
    state = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        state.update({name: t.to(torch.bfloat16) for name, t in load_file(shard).items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if "lm_head.weight" in missing:
        assert config.tie_word_embeddings, "checkpoint has no lm_head.weight but embeddings are not tied"
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def hf_latency(hf: HFBaseline, w: Workloads, cfg, log) -> list[dict]:
    r = w.latency[0]
    g = hf.generate([r.prompt_ids], r.max_tokens, time.perf_counter() + cfg.max_seconds)
    row = hf_row("latency", latency_key(w.latency), latency_key(w.latency), 1, [r.max_tokens],
                 g.new_tokens, g.seconds, g.stopped_early)
    row["ttft_ms"] = 1e3 * g.ttft
    row["tpot_ms"] = None if g.tpot is None else 1e3 * g.tpot
    return [row]


def hf_prefill(hf: HFBaseline, w: Workloads, cfg, log) -> list[dict]:
    rows, deadline = [], time.perf_counter() + cfg.max_seconds
    for length, requests in w.prefill.items():
        ttfts = [hf.generate([r.prompt_ids], 1, deadline) for r in requests if time.perf_counter() < deadline]
        rows.append(prefill_row("hf", length, [g.ttft for g in ttfts if not g.stopped_early], len(requests)))
    return rows


def hf_throughput(hf: HFBaseline, w: Workloads, cfg, log) -> list[dict]:
    """Static batches in request order, each generating as many steps as its longest request asks for."""
    requests, size = w.throughput, cfg.hf_batch_size
    start = hf.clock()
    deadline = start + cfg.max_seconds
    useful = finished = 0
    stopped = False
    for i in range(0, len(requests), size):
        batch = requests[i:i + size]
        if time.perf_counter() >= deadline:
            stopped = True
            break
        g = hf.generate([r.prompt_ids for r in batch], max(r.max_tokens for r in batch), deadline)
        useful += sum(min(g.new_tokens, r.max_tokens) for r in batch)
        finished += sum(g.new_tokens >= r.max_tokens for r in batch)
        stopped = g.stopped_early
        log(f"  HF throughput: batch {i // size + 1}/{math.ceil(len(requests) / size)} done, "
            f"{useful} useful tokens")
    elapsed = hf.clock() - start
    row = hf_row("throughput", f"static x{size}", "all requests", len(requests), [r.max_tokens for r in requests],
                 useful, elapsed, stopped or finished < len(requests))
    row["num_finished"], row["batching"] = finished, f"static, batches of {size}"
    return [row]


def hf_row(workload, variant, compare_key, num_requests, requested, output_tokens, elapsed, stopped) -> dict:
    return {"workload": workload, "system": "hf", "variant": variant, "compare_key": compare_key,
            "num_requests": num_requests, "num_finished": num_requests if not stopped else 0,
            "requested_output_tokens": sum(requested), "output_tokens": output_tokens, "elapsed_s": elapsed,
            "output_tok_s": output_tokens / elapsed if elapsed > 0 else 0.0,
            "stopped_early": stopped, "completed": not stopped}


HF_WORKLOADS = {"latency": hf_latency, "prefill": hf_prefill, "throughput": hf_throughput}
