"""The HTTP server of `tinyvllm serve` (and of `serve --debug`, debugger/serve_debug.py): a socket bound before the
model loads, uvicorn serving the FastAPI app (app.py) for an EngineLoop, and a clean exit on SIGINT / SIGTERM.

    sock = listen(host, port)
    serve_http(EngineLoop(engine), sock, served_model_name(model, name))
"""
from __future__ import annotations

import contextlib
import signal
import socket
import sys
from pathlib import Path

from tinyvllm.errors import TinyVLLMError

DEMO_MODEL_NAME = "tinyvllm-demo"
STATIC_DIR = Path(__file__).parent / "static"   # a web page, served at / when it has an index.html
BACKSTOP_S = 5.0  # uvicorn cancels handlers this long after the shutdown timeout (see make_server)


def served_model_name(model: str | None, name: str | None = None) -> str:
    """The model's name in the API: `name` when given, else the model directory's name (the demo's own name
    for the demo model)."""
    if name:
        return name
    return DEMO_MODEL_NAME if model is None else Path(model).resolve().name


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
    return clean_exit_server(config), ctx


def clean_exit_server(config):
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
