"""A real tinyvllm HTTP server on a free localhost port, in a background thread, for the serving tests."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.serving.server import listen, make_server
from tinyvllm.serving.context import ServingContext
from tinyvllm.serving.engine_loop import EngineLoop

MODEL_NAME = "tinyvllm-demo"
ENGINE_OPTIONS = dict(num_blocks=64, block_size=4, max_num_seqs=8)


def quiet(message):
    pass


@dataclass
class RunningServer:
    url: str
    ctx: ServingContext
    engine_loop: EngineLoop
    _server: object
    _thread: threading.Thread

    def openai(self, **options):
        import openai
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120, **options)

    def state(self) -> dict:
        return httpx.get(f"{self.url}/state", timeout=30).json()

    def wait_idle(self, timeout: float = 120) -> dict:
        """The /state once nothing runs, waits or holds a KV block."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if state["running"] == state["waiting"] == state["in_flight"] == state["kv_blocks"]["used"] == 0:
                return state
            assert time.monotonic() < deadline, f"server not idle: {state}"
            time.sleep(0.05)

    def disconnect_midway(self, path: str, body: dict, read_chunks: list[int]) -> list:
        """One streaming client per entry of read_chunks, all at once: each reads that many `data: {` events of
        `body` POSTed to `path`, then closes the connection mid-stream (0: right after the response headers).
        Returns what went wrong in the clients, as (n, exception) pairs."""
        errors = []

        def run(n):
            try:
                with httpx.Client(timeout=120) as http, http.stream("POST", f"{self.url}{path}", json=body) as r:
                    assert r.status_code == 200
                    lines = r.iter_lines()
                    got = 0
                    while got < n:
                        if next(lines).startswith("data: {"):
                            got += 1
                # leaving the block closes the connection mid-stream
            except Exception as e:
                errors.append((n, e))

        threads = [threading.Thread(target=run, args=(n,)) for n in read_chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        return errors

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)
        self.engine_loop.stop(timeout=0)


def start_server(model, max_waiting: int | None = 64, **engine_options) -> RunningServer:
    engine = LLMEngine(model, EngineConfig(**{**ENGINE_OPTIONS, **engine_options}), log=quiet)
    engine_loop = EngineLoop(engine, max_waiting=max_waiting, log=quiet)
    server, ctx = make_server(engine_loop, MODEL_NAME, shutdown_timeout=5, log_level="warning")
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    engine_loop.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    return RunningServer(f"http://127.0.0.1:{port}", ctx, engine_loop, server, thread)
