"""Live serving: `tinyvllm serve`, an OpenAI-compatible HTTP server and a JSONL stdin/stdout loop.

    engine_loop.py        one thread owns the LLMEngine: requests in, per-request updates out
    detokenizer.py        streamed token ids -> text deltas
    protocol.py           the OpenAI request and response bodies (pydantic)
    openai_api.py         /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize
    app.py                the FastAPI app: errors in OpenAI's shape, /health, /version, /metrics, /state
    metrics_prometheus.py vLLM's serving metrics, named tinyvllm:*, for /metrics
    live_stats.py         the JSON state a web page polls (/state)
    jsonl_loop.py         `serve --jsonl`: one request per stdin line, one result (or delta) per stdout line
    cli.py                the `serve` subcommand's arguments and start-up
"""
