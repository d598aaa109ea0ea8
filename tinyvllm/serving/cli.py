"""tinyvllm serve: an OpenAI-compatible HTTP server (FastAPI + uvicorn), or with --jsonl a loop that reads
requests from stdin and writes results to stdout, one JSON object a line.

HTTP: POST /v1/completions, /v1/chat/completions (stream: true for server-sent events), GET /v1/models,
POST /tokenize, /detokenize, GET /health, /version, /metrics (Prometheus), /state (JSON for a web page).
SIGINT / SIGTERM: stop accepting, let running requests finish for up to --shutdown-timeout s, abort the
rest, exit 0.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

from tinyvllm.errors import TinyVLLMError

DEMO_MODEL_NAME = "tinyvllm-demo"
STATIC_DIR = Path(__file__).parent / "static"   # a web page, served at / when it has an index.html
BACKSTOP_S = 5.0  # uvicorn cancels handlers this long after the shutdown timeout (see make_server)


def add_arguments(p) -> None:
    from tinyvllm.cli.main import _engine_args
    _engine_args(p)
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    s.add_argument("--port", type=int, default=8000, help="port (0: any free one; default: %(default)s)")
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
    j = p.add_argument_group("JSONL")
    j.add_argument("--jsonl", action="store_true", help="read requests from stdin, write results to stdout")
    j.add_argument("--stream", action="store_true", help="with --jsonl: also a line per token delta")


def served_model_name(args) -> str:
    if args.served_model_name:
        return args.served_model_name
    return DEMO_MODEL_NAME if args.model is None else Path(args.model).resolve().name


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
    if args.record and not os.access(Path(args.record).resolve().parent, os.W_OK):  # before the model loads
        raise TinyVLLMError(f"cannot write the recording {args.record}: its directory is missing or not writable")
    if args.debug:
        from debugger.serve_debug import run_serve_debug
        return run_serve_debug(args)
    from tinyvllm.serving.engine_loop import EngineLoop
    if args.jsonl:
        from tinyvllm.serving import jsonl_loop
        engine = _ready_engine(args)
        log = lambda message: print(message, file=sys.stderr, flush=True)
        return jsonl_loop.run(EngineLoop(engine, log=log, recorder=_recorder(args, engine)), sys.stdin, sys.stdout, stream=args.stream,
                              shutdown_timeout=args.shutdown_timeout, log=log)
    sock = listen(args.host, args.port)  # before the model loads: a busy port fails at once
    engine = _ready_engine(args)
    return serve_http(EngineLoop(engine, max_waiting=args.max_waiting, recorder=_recorder(args, engine)), sock, served_model_name(args), args.api_key,
                      args.shutdown_timeout, args.access_log)


def _ready_engine(args):
    """The engine, its CUDA graphs captured for every bucket before the first request (as vLLM does at start): a
    server's first steps at a new batch size or token count would otherwise wait for a capture, and for the first
    compile of that step's tile shapes (seconds). Without CUDA graphs (the simulator), nothing to capture."""
    from tinyvllm.cli.main import _engine
    engine = _engine(args)
    engine.capture_graphs(lambda message: print(f"tinyvllm serve: {message}", file=sys.stderr, flush=True))
    return engine


def _recorder(args, engine):
    if not getattr(args, "record", None):
        return None
    from tinyvllm.serving.recording import Recorder
    print(f"tinyvllm serve: recording to {args.record}", file=sys.stderr, flush=True)
    return Recorder.open(args.record, engine, model=args.model)


def serve_http(engine_loop, sock: socket.socket, model_name: str, api_key: str | None = None,
               shutdown_timeout: float = 10.0, access_log: bool = False) -> int:
    """Serve until SIGINT / SIGTERM; 0 after a clean shutdown."""
    server, _ = make_server(engine_loop, model_name, api_key, shutdown_timeout, access_log)
    server.on_exit_signal = lambda: engine_loop.begin_stop(shutdown_timeout)
    host, port = sock.getsockname()[:2]
    print(f"tinyvllm serve: model {model_name!r} on http://{host}:{port} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    engine_loop.start()
    try:
        server.run(sockets=[sock])
    finally:
        engine_loop.stop(timeout=0)  # whatever the graceful shutdown left running is aborted
    print("tinyvllm serve: stopped", file=sys.stderr, flush=True)
    return 0


def make_server(engine_loop, model_name: str, api_key: str | None = None, shutdown_timeout: float = 10.0,
                access_log: bool = False, log_level: str = "info"):
    """(uvicorn server, ServingContext) for a not yet started engine loop; `server.run(sockets=[sock])`
    serves until a signal or `server.should_exit = True` (the engine loop is the caller's to start and stop).
    Shutting down, uvicorn waits for open responses; the engine loop ends them (finished, or aborted at the
    shutdown timeout), so uvicorn's own limit, which cancels the handlers, is only a backstop."""
    import uvicorn
    from tinyvllm.serving.app import create_app
    from tinyvllm.serving.context import ServingContext
    ctx = ServingContext.create(engine_loop, model_name, api_key)
    app = create_app(ctx, static_dir=STATIC_DIR)
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="off",
                            timeout_graceful_shutdown=shutdown_timeout + BACKSTOP_S)
    return _server(config), ctx


def _server(config):
    """uvicorn's Server, except that a signal ends it cleanly: uvicorn re-raises a caught SIGINT / SIGTERM
    after its graceful shutdown (so the process dies of it); a server that shut down as asked exits 0.
    `on_exit_signal` runs (in a thread of its own: not inside the signal handler) when one arrives."""
    import threading
    import uvicorn

    class CleanExitServer(uvicorn.Server):
        on_exit_signal = None

        def handle_exit(self, sig, frame):
            if self.on_exit_signal is not None and not self.should_exit:
                threading.Thread(target=self.on_exit_signal, daemon=True).start()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in old.items():
                    signal.signal(s, handler)
    return CleanExitServer(config)


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise TinyVLLMError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
