"""The host side of serving: requests in, tokens out, one scheduler step at a time. No kernel is imported here.

Read in this order:
    engine.py            LLMEngine: add_request, step (schedule -> runner -> update, stop checks, outputs), generate
    config.py            EngineConfig: batching, the KV pool, precision, CUDA graphs
    scheduler.py         continuous batching within a token budget; preemption by recompute
    scheduler_output.py  SchedulerOutput: the contract between the scheduler and the runner
    block_manager.py     the paged KV pool's bookkeeping: ref-counted blocks, prefix caching by chained hashes
    sequence.py          a request's tokens, block table and progress
    stop_checks.py       whether a sequence's newest token ends it
    request.py, outputs.py  what the engine keeps per request, and what it reports (RequestOutput)
    sampling_params.py   SamplingParams, validated
    metrics.py           per-request and per-step metrics
    args.py              the engine's command-line flags, defined once
"""
