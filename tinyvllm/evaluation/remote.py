"""An OpenAI-compatible server as the backend (`tinyvllm eval --base-url URL`), through httpx.

Loglikelihood: one POST /v1/completions per question whose prompt is a batch of token-id lists, the
question's prompt followed by each choice's continuation, with echo=true, logprobs=1, max_tokens=1 and
temperature 0: what lm-evaluation-harness's `local-completions` model sends. The server returns every prompt
token's log-probability, and a choice's score is the sum over its continuation tokens, so multi-token
continuations are exact. Limits: the server must accept token-id prompts and return prompt log-probabilities
with echo (vLLM and `tinyvllm serve` do; OpenAI's hosted chat models do not), and each choice's prompt is
computed again unless the server's prefix cache serves it (a max_tokens=1 + top_logprobs request would send
the prompt once, but sees only the top 20 tokens and single-token continuations; it is not used).
Generative: with an answer prefix ("The best answer is"), the prompt is the chat template rendered here
(the served model's own, from --model) followed by the prefix, sent as token ids to /v1/completions, as
lm-eval's local-completions does with --apply_chat_template (the chat API has no standard way to begin the
assistant's turn); with `--answer-prefix ""`, the conversation goes to /v1/chat/completions.
`concurrency` requests are in flight at once (threads); results are handed back on the calling thread.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed

import httpx

from tinyvllm.errors import TinyVLLMError
from tinyvllm.evaluation.backends import Failure, Generation, GenerationJob, LoglikelihoodJob, OnDone


class RemoteBackend:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 concurrency: int = 8, timeout: float = 600.0, client: httpx.Client | None = None):
        root = base_url.rstrip("/")
        root = root[:-3] if root.endswith("/v1") else root
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(base_url=root, headers=headers, timeout=timeout)
        self.base_url = root
        self.concurrency = max(1, concurrency)
        self.model = model or self._first_model()
        self.name = f"openai-compatible server {root} (model {self.model})"

    def _first_model(self) -> str:
        try:
            response = self.client.get("/v1/models")
            response.raise_for_status()
            return response.json()["data"][0]["id"]
        except httpx.HTTPError as e:
            raise TinyVLLMError(f"cannot list models at {self.base_url}/v1/models: {e}") from e
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise TinyVLLMError(f"{self.base_url}/v1/models: no model in the answer ({e}); "
                                "name one with --served-model") from e

    def loglikelihoods(self, jobs: list[LoglikelihoodJob], on_done: OnDone) -> None:
        self._map(jobs, self._score, on_done)

    def generate(self, jobs: list[GenerationJob], max_tokens: int, stop: tuple[str, ...], on_done: OnDone) -> None:
        self._map(jobs, lambda job: self._chat(job, max_tokens, stop), on_done)

    def stats(self) -> dict:
        return {"base_url": self.base_url, "model": self.model, "concurrency": self.concurrency}

    def _map(self, jobs, work, on_done: OnDone) -> None:
        with ThreadPoolExecutor(self.concurrency) as pool:
            futures = {pool.submit(work, job): j for j, job in enumerate(jobs)}
            for future in as_completed(futures):
                on_done(futures[future], future.result())

    def _post(self, path: str, body: dict) -> dict | Failure:
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as e:
            return Failure(f"POST {path}: {type(e).__name__}: {e}")
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if response.status_code >= 400:
            detail = payload.get("error", payload) if isinstance(payload, dict) else response.text[:200]
            message = detail.get("message", detail) if isinstance(detail, dict) else detail
            return Failure(f"POST {path}: HTTP {response.status_code}: {message}")
        if not isinstance(payload, dict):
            return Failure(f"POST {path}: the answer is not a JSON object")
        return payload

    def _score(self, job: LoglikelihoodJob) -> list[float] | Failure:
        prompts = [job.prompt_ids + list(c) for c in job.continuations]
        payload = self._post("/v1/completions", {"model": self.model, "prompt": prompts, "max_tokens": 1,
                                                 "temperature": 0, "logprobs": 1, "echo": True})
        if isinstance(payload, Failure):
            return payload
        try:
            choices = sorted(payload["choices"], key=lambda c: c["index"])
            scores = []
            for prompt, c, choice in zip(prompts, job.continuations, choices, strict=True):
                token_logprobs = choice["logprobs"]["token_logprobs"]
                start = len(job.prompt_ids)
                if len(token_logprobs) < len(prompt):
                    return Failure(f"/v1/completions gave {len(token_logprobs)} log-probabilities for a "
                                   f"{len(prompt)}-token prompt: does the server support echo with logprobs?")
                scores.append(float(sum(token_logprobs[start:start + len(c)])))
            return scores
        except (KeyError, TypeError, ValueError) as e:
            return Failure(f"/v1/completions: unexpected answer shape ({type(e).__name__}: {e})")

    def _chat(self, job: GenerationJob, max_tokens: int, stop: tuple[str, ...]) -> Generation | Failure:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": 0}
        if stop:
            body["stop"] = list(stop)
        if job.answer_prefix:  # the chat template rendered here, the prefix after it: a completion
            path, body["prompt"] = "/v1/completions", job.prompt_ids
        else:
            path, body["messages"] = "/v1/chat/completions", job.messages
        payload = self._post(path, body)
        if isinstance(payload, Failure):
            return payload
        try:
            choice = payload["choices"][0]
            text = (choice["text"] if job.answer_prefix else choice["message"]["content"]) or ""
            usage = payload.get("usage") or {}
            return Generation(text, int(usage.get("completion_tokens") or 0))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            return Failure(f"{path}: unexpected answer shape ({type(e).__name__}: {e})")
