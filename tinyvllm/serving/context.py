"""What every route needs: the engine loop, the served model's name and limits, request -> engine inputs."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tinyvllm.engine.engine import LLMEngine
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.serving.engine_loop import EngineLoop, LoopClosed, QueueFull
from tinyvllm.serving.inputs import RequestInputs
from tinyvllm.serving.live_stats import LiveStats
from tinyvllm.serving.metrics_prometheus import PrometheusMetrics
from tinyvllm.serving.protocol import ApiError
from tinyvllm.serving.streams import AsyncRouter, RequestGroup

RETRY_AFTER_S = 1


@dataclass
class ServingContext:
    engine_loop: EngineLoop
    model_name: str
    model_root: str                     # the model directory, shown by /v1/models
    prometheus: PrometheusMetrics
    live_stats: LiveStats
    api_key: str | None = None
    started: float = field(default_factory=time.time)
    _routers: dict = field(default_factory=dict)

    @classmethod
    def create(cls, engine_loop: EngineLoop, model_name: str, api_key: str | None = None) -> ServingContext:
        """A context whose metrics observe `engine_loop` (call before engine_loop.start())."""
        engine = engine_loop.engine
        prometheus = PrometheusMetrics(model_name, engine.max_model_len)
        live_stats = LiveStats()
        engine_loop.observers += [prometheus, live_stats]
        return cls(engine_loop, model_name, str(engine.model.model_dir), prometheus, live_stats, api_key)

    @property
    def engine(self) -> LLMEngine:
        return self.engine_loop.engine

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def inputs(self) -> RequestInputs:
        return RequestInputs(self.engine)

    @property
    def context_limit(self) -> int:
        return self.inputs.context_limit

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ApiError(404, f"The model `{name}` does not exist; this server serves `{self.model_name}`",
                           param="model")

    def router(self) -> AsyncRouter:
        """The router of the running event loop (one per loop: tests may run several)."""
        event_loop = asyncio.get_running_loop()
        router = self._routers.get(event_loop)
        if router is None:
            router = self._routers[event_loop] = AsyncRouter(self.engine_loop, event_loop)
        return router

    def open(self, prompts: list, params: list[SamplingParams], id_prefix: str) -> RequestGroup:
        """Submit a request's prompts to the engine loop; 503 (+ Retry-After) when it cannot take them."""
        try:
            return self.router().open(prompts, params, id_prefix)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy: {e}; retry later", headers={"Retry-After": str(RETRY_AFTER_S)}) from e
        except LoopClosed as e:
            raise ApiError(503, str(e)) from e
