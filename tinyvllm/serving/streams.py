"""The engine loop seen from asyncio: one router per event loop, one RequestGroup per HTTP request.

The engine loop calls the router (its sink) once per step with the updates of all of this event loop's
requests; the router hops onto the event loop once (call_soon_threadsafe) and puts each update into the
queue of the group it belongs to. A group is the engine requests of one HTTP request (a batch of
prompts is several) feeding one queue; leaving it early (`abort()`, e.g. when the client disconnects)
aborts whatever of it is still in flight.
"""
from __future__ import annotations

import asyncio

from tinyvllm.serving.engine_loop import EngineLoop, Update


class ClientDisconnected(Exception):
    """The client of a RequestGroup went away before its answer was complete."""


_DISCONNECTED = object()


class AsyncRouter:
    def __init__(self, engine_loop: EngineLoop, event_loop: asyncio.AbstractEventLoop):
        self.engine_loop = engine_loop
        self.event_loop = event_loop
        self._queues: dict[str, asyncio.Queue] = {}

    def __call__(self, updates: list[Update]) -> None:  # on the engine loop's thread
        self.event_loop.call_soon_threadsafe(self._route, updates)

    def _route(self, updates: list[Update]) -> None:  # on the event loop
        for update in updates:
            queue = self._queues.get(update.request_id)
            if queue is not None:
                queue.put_nowait(update)
                if update.finished:
                    del self._queues[update.request_id]

    def open(self, prompts: list, params: list, id_prefix: str) -> RequestGroup:
        """Submit each (prompt, params) pair; all or none (QueueFull / LoopClosed propagate)."""
        group = RequestGroup(self)
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                request_id = self.engine_loop.submit(prompt, p, self, request_id=f"{id_prefix}-{i}")
                self._queues[request_id] = group.queue
                group.index[request_id] = i
        except BaseException:
            group.abort()
            raise
        return group


class RequestGroup:
    def __init__(self, router: AsyncRouter):
        self.router = router
        self.queue: asyncio.Queue[Update] = asyncio.Queue()
        self.index: dict[str, int] = {}        # request id -> choice index
        self._unfinished: set[str] | None = None

    def __aiter__(self):
        self._unfinished = set(self.index)
        return self

    async def __anext__(self) -> tuple[int, Update]:
        if not self._unfinished:
            raise StopAsyncIteration
        update = await self.queue.get()
        if update is _DISCONNECTED:
            raise ClientDisconnected()
        if update.finished:
            self._unfinished.discard(update.request_id)
        return self.index[update.request_id], update

    def disconnect(self) -> None:
        """Called on the event loop when the client goes away: the iteration raises ClientDisconnected."""
        self.queue.put_nowait(_DISCONNECTED)

    def abort(self) -> None:
        """Abort the group's requests still in flight (a no-op for finished ones)."""
        for request_id in self.index:
            if self._unfinished is None or request_id in self._unfinished:
                self.router.engine_loop.abort(request_id)
