"""The OpenAI-compatible routes: completions, chat completions (both also as server-sent events), models,
and vLLM's tokenize / detokenize.

A generation route validates everything (body, model name, prompt length, sampling fields) before it
submits anything, so a bad request is a 400 and never reaches the engine. A streamed answer is one
`data: {chunk}` event per engine step per choice, then `data: [DONE]`; when the client goes away, the
response is cancelled and the request aborted at once (its KV blocks go back to the pool).
"""
from __future__ import annotations

import asyncio
import json
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from tinyvllm.serving import logprobs
from tinyvllm.serving.context import ServingContext
from tinyvllm.serving.detokenizer import IncrementalDetokenizer
from tinyvllm.serving.engine_loop import Update
from tinyvllm.serving.protocol import (ApiError, AssistantMessage, ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
                       ChatCompletionResponse, ChatStreamChoice, CompletionChoice, CompletionRequest,
                       CompletionResponse, DeltaMessage, DetokenizeRequest, DetokenizeResponse, ModelCard,
                       ModelList, TokenizeRequest, TokenizeResponse, Usage)
from tinyvllm.serving.streams import RequestGroup

router = APIRouter()


def _context(request: Request) -> ServingContext:
    return request.app.state.serving


def _json(model) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def _event(model) -> str:
    return f"data: {model.model_dump_json()}\n\n"


def _error_event(update: Update) -> str:
    return f"data: {json.dumps(ApiError(400, update.error or 'the request failed').body())}\n\n"


def _sse(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _final_updates(group: RequestGroup, request: Request) -> dict[int, tuple[Update, list]]:
    """Wait for every request of a non-streamed answer: {choice: (last update, all output logprobs)}.
    Listens for the client's disconnect meanwhile, and aborts what is left if it comes."""
    async def watch():
        while (await request.receive())["type"] != "http.disconnect":
            pass
        group.disconnect()

    watcher = asyncio.ensure_future(watch())
    done: dict[int, tuple[Update, list]] = {}
    collected: dict[int, list] = {}
    try:
        async for index, update in group:
            if update.new_logprobs is not None:
                collected.setdefault(index, []).extend(update.new_logprobs)
            if update.finished:
                done[index] = (update, collected.get(index, []))
        return done
    finally:
        watcher.cancel()
        group.abort()


def _raise_if_failed(update: Update) -> None:
    if update.finish_reason == "error":
        raise ApiError(400, update.error or "the request failed")


# ---- /v1/completions ------------------------------------------------------------------------------
@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request):
    ctx = _context(request)
    ctx.check_model(body.model)
    extra = logprobs.sampling_fields(body.logprobs, with_prompt=body.echo)
    prepared = [ctx.inputs.prepare_prompt(p, "prompt") for p in body.prompts()]
    params = [ctx.inputs.sampling_params(body, len(ids), body.max_tokens, **extra) for _, ids in prepared]
    prompt_texts = [text if isinstance(p, str) else ctx.tokenizer.decode(ids)  # what echo puts first
                    for p, (text, ids) in zip(body.prompts(), prepared)]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    group = ctx.open([ids for _, ids in prepared], params, request_id)
    token_text = logprobs.TokenText(ctx.tokenizer.decode)
    model = ctx.model_name

    def choice_logprobs(index: int, token_ids: list[int], entries, first_update: Update | None, offset: int):
        if body.logprobs is None:
            return None
        ids, all_entries = token_ids, entries
        if first_update is not None and body.echo:  # the prompt's tokens first
            prompt_ids = prepared[index][1]
            prompt_entries = first_update.prompt_logprobs or [None] * len(prompt_ids)
            ids, all_entries = prompt_ids + token_ids, list(prompt_entries) + list(entries)
            offset = 0
        return logprobs.completion_logprobs(ids, all_entries, body.logprobs, token_text, offset)

    if body.stream:
        async def events():
            detokenizers = [IncrementalDetokenizer(ctx.tokenizer.decode, p.stop) for p in params]
            started: set[int] = set()
            offsets = [len(t) if body.echo else 0 for t in prompt_texts]
            usage = [0, 0]
            try:
                async for index, update in group:
                    if update.finish_reason == "error":
                        yield _error_event(update)
                        yield "data: [DONE]\n\n"
                        return
                    detok = detokenizers[index]
                    # the last update's text is the engine's final text (stop strings cut), not more deltas
                    text = detok.finish(update.text) if update.finished else detok.add(update.new_token_ids)
                    if update.finished:
                        usage[0] += update.num_prompt_tokens
                        usage[1] += len(update.token_ids)
                    first = index not in started
                    started.add(index)
                    lp = choice_logprobs(index, update.new_token_ids, update.new_logprobs or [],
                                         update if first else None, offsets[index])
                    offsets[index] += len(text)
                    if first and body.echo:
                        text = prompt_texts[index] + text
                    if text or update.finished or lp is not None or body.return_token_ids:
                        ids = update.new_token_ids if body.return_token_ids else None
                        prompt_ids = prepared[index][1] if body.return_token_ids and first else None
                        yield _event(CompletionResponse(id=request_id, model=model, choices=[CompletionChoice(
                            index=index, text=text, logprobs=lp, finish_reason=update.finish_reason,
                            token_ids=ids, prompt_token_ids=prompt_ids)]))
                if body.include_usage:
                    yield _event(CompletionResponse(id=request_id, model=model, choices=[], usage=Usage.of(*usage)))
                yield "data: [DONE]\n\n"
            finally:
                group.abort()
        return _sse(events())

    done = await _final_updates(group, request)
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for index in range(len(prepared)):
        update, entries = done[index]
        _raise_if_failed(update)
        prefix = prompt_texts[index] if body.echo else ""
        choices.append(CompletionChoice(index=index, text=prefix + update.text, finish_reason=update.finish_reason,
                                        logprobs=choice_logprobs(index, update.token_ids, entries, update, 0),
                                        token_ids=update.token_ids if body.return_token_ids else None,
                                        prompt_token_ids=prepared[index][1] if body.return_token_ids else None))
        prompt_tokens += update.num_prompt_tokens
        completion_tokens += len(update.token_ids)
    return _json(CompletionResponse(id=request_id, model=model, choices=choices,
                                    usage=Usage.of(prompt_tokens, completion_tokens)))


# ---- /v1/chat/completions -------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    ctx = _context(request)
    ctx.check_model(body.model)
    top_n = (body.top_logprobs or 0) if body.logprobs else None
    extra = logprobs.sampling_fields(top_n)
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise ApiError(400, "give max_completion_tokens or max_tokens, not both", param="max_completion_tokens")
    max_tokens, max_param = ((body.max_completion_tokens, "max_completion_tokens")
                             if body.max_completion_tokens is not None else (body.max_tokens, "max_tokens"))
    _, ids = ctx.inputs.prepare_prompt(body.conversation(), "messages")
    params = ctx.inputs.sampling_params(body, len(ids), max_tokens, max_param, **extra)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    group = ctx.open([ids], [params], request_id)
    token_text = logprobs.TokenText(ctx.tokenizer.decode)
    model = ctx.model_name

    def choice_logprobs(token_ids, entries):
        return None if top_n is None else logprobs.chat_logprobs(token_ids, entries, top_n, token_text)

    if body.stream:
        async def events():
            detok = IncrementalDetokenizer(ctx.tokenizer.decode, params.stop)
            usage = None
            try:
                yield _event(ChatCompletionChunk(id=request_id, model=model, choices=[ChatStreamChoice(
                    index=0, delta=DeltaMessage(role="assistant", content=""),
                    token_ids=[] if body.return_token_ids else None)]))
                async for index, update in group:
                    if update.finish_reason == "error":
                        yield _error_event(update)
                        yield "data: [DONE]\n\n"
                        return
                    text = detok.finish(update.text) if update.finished else detok.add(update.new_token_ids)
                    if update.finished:
                        usage = Usage.of(update.num_prompt_tokens, len(update.token_ids))
                    lp = choice_logprobs(update.new_token_ids, update.new_logprobs or [])
                    if text or update.finished or lp is not None or body.return_token_ids:
                        yield _event(ChatCompletionChunk(id=request_id, model=model, choices=[ChatStreamChoice(
                            index=index, delta=DeltaMessage(content=text), logprobs=lp,
                            finish_reason=update.finish_reason,
                            token_ids=update.new_token_ids if body.return_token_ids else None)]))
                if body.include_usage and usage is not None:
                    yield _event(ChatCompletionChunk(id=request_id, model=model, choices=[], usage=usage))
                yield "data: [DONE]\n\n"
            finally:
                group.abort()
        return _sse(events())

    update, entries = (await _final_updates(group, request))[0]
    _raise_if_failed(update)
    choice = ChatChoice(index=0, message=AssistantMessage(content=update.text), finish_reason=update.finish_reason,
                        logprobs=choice_logprobs(update.token_ids, entries),
                        token_ids=update.token_ids if body.return_token_ids else None)
    return _json(ChatCompletionResponse(id=request_id, model=model, choices=[choice],
                                        usage=Usage.of(update.num_prompt_tokens, len(update.token_ids)),
                                        prompt_token_ids=ids if body.return_token_ids else None))


# ---- models, tokenize, detokenize -----------------------------------------------------------------
@router.get("/v1/models")
async def list_models(request: Request):
    ctx = _context(request)
    return _json(ModelList(data=[ModelCard(id=ctx.model_name, root=ctx.model_root, max_model_len=ctx.context_limit)]))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    ctx = _context(request)
    ctx.check_model(body.model)
    tok = ctx.tokenizer
    try:
        if body.messages is not None:
            conversation = ChatCompletionRequest(messages=body.messages).conversation()
            ids = tok.encode_chat(conversation, add_generation_prompt=body.add_generation_prompt)
        else:
            ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens) if body.prompt else []
    except Exception as e:  # the chat template's own errors
        raise ApiError(400, f"{'messages' if body.messages is not None else 'prompt'}: {e}") from e
    return _json(TokenizeResponse(count=len(ids), max_model_len=ctx.context_limit, tokens=ids))


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    ctx = _context(request)
    ctx.check_model(body.model)
    vocab = ctx.engine.model.config.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise ApiError(400, f"tokens: ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="tokens")
    return _json(DetokenizeResponse(prompt=ctx.tokenizer.decode(body.tokens)))
