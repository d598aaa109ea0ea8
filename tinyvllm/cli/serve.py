"""tinyvllm serve: an OpenAI-compatible HTTP server (FastAPI + uvicorn), or with --jsonl a loop that reads
requests from stdin and writes results to stdout, one JSON object a line.

HTTP: POST /v1/completions, /v1/chat/completions (stream: true for server-sent events), GET /v1/models,
POST /tokenize, /detokenize, GET /health, /version, /metrics (Prometheus), /state (JSON for a web page).
SIGINT / SIGTERM: stop accepting, let running requests finish for up to --shutdown-timeout s, abort the
rest, exit 0.
"""
from __future__ import annotations

import argparse
import os
import sys

from tinyvllm.cli import SERVE_DEBUG, load
from tinyvllm.engine.args import add_engine_arguments, build_engine
from tinyvllm.errors import TinyVLLMError
from tinyvllm.serving.recording import check_recording_path
from tinyvllm.serving.server import DEMO_MODEL_NAME, listen, serve_http, served_model_name

DESCRIPTION = __doc__


def add_arguments(p) -> None:
    add_engine_arguments(p)
    s = p.add_argument_group("server")
    s.add_argument("--host", type=host, default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface; default: %(default)s)")
    s.add_argument("--port", type=port, default=8000, help="port, 1-65535 (0: any free one; default: %(default)s)")
    s.add_argument("--served-model-name", metavar="NAME",
                   help=f"the model's name in the API (default: the model directory's name, {DEMO_MODEL_NAME} "
                        "for the demo model)")
    s.add_argument("--api-key", metavar="KEY", default=os.environ.get("TINYVLLM_API_KEY"),
                   help="require Authorization: Bearer KEY on /v1/*, /tokenize, /detokenize "
                        "(default: $TINYVLLM_API_KEY, else none)")
    s.add_argument("--max-waiting", type=int, default=1024, metavar="N",
                   help="answer 503 + Retry-After while N requests wait to run (default: %(default)s)")
    s.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="S",
                   help="on SIGINT/SIGTERM, let running requests finish for up to S seconds (default: %(default)s)")
    s.add_argument("--access-log", action="store_true", help="log every HTTP request (uvicorn's access log)")
    s.add_argument("--record", metavar="FILE",
                   help="write every request as it arrives and every answer to FILE (JSONL), for "
                        "`tinyvllm bench --replay FILE`")
    s.add_argument("--debug", action="store_true",
                   help="step the server in the debugger: HTTP in the background, the engine paused until you "
                        "step it (s / l / d) or let it serve (c); w records the session")
    s.add_argument("--compare-alone", action="store_true",
                   help="with --debug: keep every stage's rows, so that D shows where a request's run parts from the "
                        "same request run alone")
    j = p.add_argument_group("JSONL")
    j.add_argument("--jsonl", action="store_true", help="read requests from stdin, write results to stdout")
    j.add_argument("--stream", action="store_true", help="with --jsonl: also a line per token delta")


def port(text: str) -> int:
    """--port's value: a TCP port number, checked here because the socket's bind would raise OverflowError."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range (1-65535, or 0 for any free port)")
    return value


def host(text: str) -> str:
    """--host's value: a name or address. An empty one would silently listen on every interface, and a NUL
    makes the socket raise TypeError; whether the name resolves is checked when the server binds."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty (use 0.0.0.0 to listen on every interface)")
    if any(c.isspace() or c == "\0" for c in text):
        raise argparse.ArgumentTypeError(f"not a host name or address: {text!r}")
    return text


def run(args) -> int:
    try:
        import fastapi, prometheus_client, pydantic, uvicorn  # noqa: E401,F401  (checked before the model loads)
    except ImportError as e:
        raise TinyVLLMError(f"tinyvllm serve needs {e.name}: pip install fastapi 'uvicorn[standard]' pydantic "
                            f"prometheus-client") from e
    if args.stream and not args.jsonl:
        raise TinyVLLMError("--stream goes with --jsonl (HTTP clients ask for streaming with stream: true)")
    if args.max_waiting < 0 or args.shutdown_timeout < 0:
        raise TinyVLLMError("--max-waiting and --shutdown-timeout must be >= 0")
    if args.record:
        check_recording_path(args.record)
    if args.compare_alone and not args.debug:
        raise TinyVLLMError("--compare-alone is the debugger's: tinyvllm serve --debug --compare-alone")
    if args.debug:  # a debugger front end: loaded by its module path, as tinyvllm imports no debugger
        return load(SERVE_DEBUG).run(args)
    from tinyvllm.serving.engine_loop import EngineLoop
    if args.jsonl:
        from tinyvllm.serving import jsonl_loop
        engine = _ready_engine(args)
        log = lambda message: print(message, file=sys.stderr, flush=True)
        return jsonl_loop.run(EngineLoop(engine, log=log, recorder=_recorder(args, engine)), sys.stdin, sys.stdout,
                              stream=args.stream, shutdown_timeout=args.shutdown_timeout, log=log)
    sock = listen(args.host, args.port)  # before the model loads: a busy port fails at once
    engine = _ready_engine(args)
    return serve_http(EngineLoop(engine, max_waiting=args.max_waiting, recorder=_recorder(args, engine)), sock,
                      served_model_name(args.model, args.served_model_name), args.api_key, args.shutdown_timeout,
                      args.access_log)


def _ready_engine(args):
    """The engine, its CUDA graphs captured for every bucket before the first request (as vLLM does at start): a
    server's first steps at a new batch size or token count would otherwise wait for a capture, and for the first
    compile of that step's tile shapes (seconds). Without CUDA graphs (the simulator), nothing to capture."""
    engine = build_engine(args)
    engine.capture_graphs(lambda message: print(f"tinyvllm serve: {message}", file=sys.stderr, flush=True))
    return engine


def _recorder(args, engine):
    if not getattr(args, "record", None):
        return None
    from tinyvllm.serving.recording import Recorder
    print(f"tinyvllm serve: recording to {args.record}", file=sys.stderr, flush=True)
    return Recorder.open(args.record, engine, model=args.model)
