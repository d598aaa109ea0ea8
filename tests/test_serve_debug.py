"""tinyvllm serve --debug and debug --replay: the debugger stepping an engine whose requests come from real
HTTP clients (the official openai client, on a free localhost port) or from a recording."""
import asyncio
import json
import threading
import time

import httpx
import pytest
from textual.widgets import DataTable

from debugger.app import DebuggerApp
from debugger.session import Breakpoint
from tinyvllm.engine import EngineConfig, LLMEngine
from tinyvllm.model import load_model
from tinyvllm.sampling_params import SamplingParams
from tinyvllm.serving.cli import listen
from tinyvllm.serving.debug_mode import _HTTP_CLIENT, HttpClient, ServerThread, replay_session, serving_session
from tinyvllm.serving.recording import read_recording

from .test_debugger_app import cells, settle, shown

CONFIG = dict(num_blocks=64, block_size=4, max_num_seqs=8)


@pytest.fixture(scope="module")
def model():
    return load_model(None, log=lambda message: None)


@pytest.fixture
def served(model):
    """A debugger session whose feed is served over HTTP on a free port; stopped after the test."""
    engine = LLMEngine(model, EngineConfig(**CONFIG), log=lambda message: None)
    session, feed = serving_session(engine, None)
    server = ServerThread(feed, listen("127.0.0.1", 0), "tinyvllm-demo")
    feed.url = server.url
    feed.start()
    server.start()
    yield session, feed, server
    feed.close()
    server.stop()
    assert not server.thread.is_alive()


def stream_client(url: str, prompt: str, max_tokens: int, received: list, **body):
    """A streamed completion from the openai client in a thread; `received` gets each chunk's token ids."""
    import openai
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def run():
        for chunk in client.completions.create(model="tinyvllm-demo", prompt=prompt, max_tokens=max_tokens,
                                               stream=True, **body,
                                               extra_body={"ignore_eos": True, "return_token_ids": True}):
            received.append((chunk.choices[0].token_ids or [], chunk.choices[0].finish_reason))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def tokens(received) -> int:
    return sum(len(ids) for ids, _ in received)


async def until(pilot, condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


def rows(app) -> list[list[str]]:
    table = app.query_one("#scheduler-table", DataTable)
    return [cells(table, i) for i in range(table.row_count)]


def test_pilot_steps_an_openai_streaming_client_token_by_token(served):
    session, feed, server = served
    app = DebuggerApp(session)
    received = []

    async def scenario(pilot):
        client = stream_client(server.url, "The sun rose", 3, received, temperature=0)
        await until(pilot, lambda: rows(app))          # shown as it arrives, while the engine is paused
        row = rows(app)[0]
        assert row[0].startswith("cmpl-") and row[1] == "arrived"
        assert row[8].startswith("127.0.0.1:") and row[9] == "greedy max 3" and row[10].startswith("arrived")
        await pilot.pause(0.5)
        assert received == [] and session.engine.num_steps == 0   # paused: nothing ran by itself
        for n in (1, 2):                                # d: one scheduler step, exactly one more token
            await pilot.press("d")
            await settle(pilot)
            await until(pilot, lambda: tokens(received) >= n)
            await pilot.pause(0.3)
            assert tokens(received) == n, received
            assert rows(app)[0][10] == f"streaming · {n} sent"
        await pilot.press("c")                          # serve freely: the last token, the stream ends
        await asyncio.get_running_loop().run_in_executor(None, client.join, 120)
        assert tokens(received) == 3 and received[-1][1] == "length"
        await until(pilot, lambda: rows(app)[0][10] == "done · 3 sent")
        assert "serve" in shown(app, "#status")         # still serving: waiting for the next client
        await pilot.press("x")
        await settle(pilot)

        # a client that goes away while the server is paused: its request is aborted, its blocks freed
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{server.url}/v1/completions",
                             json={"prompt": "a river", "max_tokens": 8, "stream": True}) as response:
                await until(pilot, lambda: len(rows(app)) == 2)
                await pilot.press("d")
                await settle(pilot)
                assert session.engine.block_manager.usage > 0
        await until(pilot, lambda: rows(app)[1][10] == "client gone · aborted")
        assert session.engine.block_manager.usage == 0 and not session.in_step
        assert response.status_code == 200

    asyncio.run(_drive(app, scenario))


async def _drive(app, scenario, size=(170, 50)):
    async with app.run_test(size=size) as pilot:
        await scenario(pilot)
        await pilot.press("q")
