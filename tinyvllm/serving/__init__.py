"""Live serving: `tinyvllm serve`, an OpenAI-compatible HTTP server and a JSONL stdin/stdout loop.

    engine_loop.py        one thread owns the LLMEngine: requests in, per-request updates out
    streams.py            the engine loop seen from asyncio (a queue per HTTP request)
    detokenizer.py        streamed token ids -> text deltas
    protocol.py           the OpenAI request and response bodies (pydantic), errors in OpenAI's shape
    inputs.py             a request's fields -> token ids and SamplingParams, checked (HTTP and JSONL)
    logprobs.py           the engine's logprobs in OpenAI's completion and chat shapes
    context.py            what the routes share: the loop, the model's name and limits, the metrics
    openai_api.py         /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize
    app.py                the FastAPI app: error handlers, /health, /version, /metrics, /state, static files
    metrics_prometheus.py vLLM's serving metrics, named tinyvllm:*, for /metrics
    live_stats.py         the JSON state a web page polls (/state)
    jsonl_loop.py         `serve --jsonl`: one request per stdin line, one result (or delta) per stdout line
    server.py             the socket, uvicorn with a clean exit on signals (the `serve` command: cli/serve.py)
"""
