"""The same loglikelihood jobs through HF transformers: the reference of scripts/eval_compare_hf.py and the
baseline of scripts/eval_bench.py (imports torch; the engine never imports this module).

HFBackend has the backends' interface, so runner.run_task scores the very same prompts and continuations
with it. Each job becomes the sequences prompt + continuation[:-1] (one sequence for single-token
continuations); a choice's score is the sum of log_softmax(logits)[position, token] over its tokens, the
computation of lm-evaluation-harness's HF model. Sequences are sorted by length and run in right-padded
batches of at most `batch_tokens` padded tokens; only the positions that score something go through the
LM head, so the vocabulary-sized logits are never materialised for whole prompts.
"""
from __future__ import annotations

import time
from pathlib import Path

from tinyvllm.evaluation.backends import Failure, LoglikelihoodJob, OnDone


def load_hf_model(model_dir: str | Path, device: str, dtype: str = "float32", round_to_bf16: bool = True):
    """LlamaForCausalLM on `device`: float32 eager attention (goldens/hf_reference.py's reference) or bf16
    sdpa (the benchmark baseline, tinyvllm/bench's). `round_to_bf16`: weights rounded to bf16 values first,
    as tinyvllm stores them (a no-op for a bf16 checkpoint). A .gguf (or a directory holding one) is read by
    transformers' own GGUF code (goldens/hf_gguf.py; needs the repository root on sys.path)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM

    from tinyvllm.model.gguf import find_gguf_file
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    gguf_file = find_gguf_file(model_dir)
    if gguf_file is not None:  # transformers reads and dequantizes the GGUF itself: an independent import
        from goldens.hf_gguf import load_hf_gguf_model
        model = load_hf_gguf_model(gguf_file, "cpu", bf16_weights=round_to_bf16).to(torch_dtype)
        model.config._attn_implementation = "eager" if dtype == "float32" else "sdpa"
        return model.to(device).eval()
    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "eager" if dtype == "float32" else "sdpa"
    try:
        model = LlamaForCausalLM._from_config(config, dtype=torch_dtype)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = LlamaForCausalLM._from_config(config, torch_dtype=torch_dtype)
    state = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        for name, t in load_file(shard).items():
            state[name] = (t.to(torch.bfloat16) if round_to_bf16 else t).to(torch_dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if "lm_head.weight" in missing:
        assert config.tie_word_embeddings, "checkpoint has no lm_head.weight but embeddings are not tied"
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


class HFBackend:
    def __init__(self, model, batch_tokens: int = 32768, max_batch: int = 64, deadline: float | None = None):
        import torch
        import transformers
        self.torch, self.model = torch, model
        self.device = next(model.parameters()).device
        self.batch_tokens, self.max_batch, self.deadline = batch_tokens, max_batch, deadline
        dtype = next(model.parameters()).dtype
        self.name = (f"HF transformers {transformers.__version__} ({str(dtype).replace('torch.', '')}, "
                     f"{model.config._attn_implementation}, {self.device}), torch {torch.__version__}")
        self.sequences_run = self.padded_tokens = 0

    def loglikelihoods(self, jobs: list[LoglikelihoodJob], on_done: OnDone) -> None:
        sequences: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # tokens -> (job, continuation) it scores
        for j, job in enumerate(jobs):
            for k, c in enumerate(job.continuations):
                sequences.setdefault(tuple(job.prompt_ids) + tuple(c[:-1]), []).append((j, k))
        scores = [[None] * len(job.continuations) for job in jobs]
        left = [len(job.continuations) for job in jobs]
        ordered = sorted(sequences, key=len, reverse=True)
        start = 0
        while start < len(ordered):
            width = len(ordered[start])
            size = max(1, min(self.max_batch, self.batch_tokens // width, len(ordered) - start))
            batch = ordered[start:start + size]
            start += size
            if self.deadline is not None and time.perf_counter() > self.deadline:
                for tokens in batch:
                    for j, _ in sequences[tokens]:
                        if left[j] > 0:
                            left[j] = 0
                            on_done(j, Failure("not run: the time limit was reached"))
                continue
            for tokens, values in zip(batch, self._score_batch(batch, [sequences[t] for t in batch], jobs)):
                for (j, k), value in zip(sequences[tokens], values):
                    if left[j] <= 0:
                        continue
                    scores[j][k] = value
                    left[j] -= 1
                    if left[j] == 0:
                        on_done(j, scores[j])

    def _score_batch(self, batch, owners, jobs) -> list[list[float]]:
        """For each sequence, the scores of the continuations it serves."""
        torch = self.torch
        width = len(batch[0])
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        rows, positions, targets = [], [], []  # one entry per scored token
        for b, tokens in enumerate(batch):
            ids[b, :len(tokens)] = torch.tensor(tokens)
            mask[b, :len(tokens)] = 1
            for j, k in owners[b]:
                n, c = len(jobs[j].prompt_ids), jobs[j].continuations[k]
                for t, token in enumerate(c):
                    rows.append(b)
                    positions.append(n - 1 + t)
                    targets.append(token)
        with torch.inference_mode():
            hidden = self.model.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
            picked = hidden[torch.tensor(rows, device=self.device), torch.tensor(positions, device=self.device)]
            logprobs = torch.log_softmax(self.model.lm_head(picked).float(), dim=-1)
            values = logprobs[torch.arange(len(targets), device=self.device),
                              torch.tensor(targets, device=self.device)].double().cpu().tolist()
        self.sequences_run += len(batch)
        self.padded_tokens += len(batch) * width
        out, i = [], 0
        for b in range(len(batch)):
            per = []
            for j, k in owners[b]:
                n_tokens = len(jobs[j].continuations[k])
                per.append(float(sum(values[i:i + n_tokens])))
                i += n_tokens
            out.append(per)
        return out

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def stats(self) -> dict:
        return {"sequences": self.sequences_run, "padded_tokens": self.padded_tokens,
                "batch_tokens": self.batch_tokens}
