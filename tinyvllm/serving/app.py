"""The FastAPI app: the OpenAI routes, errors in OpenAI's shape, and the server's own endpoints.

    GET /health   200 while the engine loop runs, 503 once it has stopped
    GET /version  {"version": ...}
    GET /metrics  Prometheus text (metrics_prometheus.py)
    GET /state    the live state as JSON, for a web page to poll (live_stats.py)
    GET /         `static_dir`/index.html (the web page; its files under /static/), if given; else a JSON index

Every error is {"error": {"message", "type", "param", "code"}}: a body that is not JSON, a field of the
wrong type or value, an unknown field: 400 naming it; a body sent without Content-Type: application/json:
400 naming what it came with and what to send. Such a body is not read as JSON on purpose (FastAPI's
strict_content_type): browsers send a POST without a Content-Type, or with a form's or text/plain, across
origins without a CORS preflight, so any web page could make a local server generate. An unknown model:
404; a full queue: 503 with Retry-After. A bug of ours is a 500 whose message names the exception, never
a traceback (that goes to the server's log).
"""
from __future__ import annotations

import secrets
import sys
import time
import traceback
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from tinyvllm import __version__
from tinyvllm.serving import openai_api
from tinyvllm.serving.context import ServingContext
from tinyvllm.serving.protocol import ApiError, validation_error
from tinyvllm.serving.streams import ClientDisconnected

def create_app(ctx: ServingContext, static_dir: str | Path | None = None) -> FastAPI:
    app = FastAPI(title="tinyvllm", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serving = ctx

    def error(e: ApiError) -> JSONResponse:
        ctx.live_stats.on_http_error(e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error(e)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError):
        return error(validation_error(e.errors(), request.headers.get("content-type")))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return error(ApiError(e.status_code, message, headers=getattr(e, "headers", None)))

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request: Request, e: ClientDisconnected):
        return Response(status_code=499)  # nobody reads it; the request was aborted

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        print(f"internal error on {request.method} {request.url.path}:", file=sys.stderr)
        traceback.print_exc()
        return error(ApiError(500, f"internal error: {type(e).__name__}: {e}"))

    async def check_api_key(request: Request):
        if ctx.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {ctx.api_key}".encode()):
            raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)")

    app.include_router(openai_api.router, dependencies=[Depends(check_api_key)])

    @app.get("/health")
    async def health():
        if not ctx.engine_loop.alive:
            raise ApiError(503, f"the engine loop is not running{f': {ctx.engine_loop.error}' if ctx.engine_loop.error else ''}")
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics():
        return Response(ctx.prometheus.render(ctx.engine_loop.state), media_type=CONTENT_TYPE_LATEST)

    @app.get("/state")
    async def state():
        loop = ctx.engine_loop
        return ctx.live_stats.snapshot(loop.state, ctx.model_name, time.time() - ctx.started, loop.num_in_flight)

    api_paths = {route.path for route in openai_api.router.routes}

    @app.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                   include_in_schema=False)
    async def unknown_api_route(request: Request, rest: str):
        # before the static files' catch-all mount, which would answer 405 to any POST
        path = request.url.path
        if path in api_paths:
            raise ApiError(405, f"{request.method} is not allowed on {path}")
        raise ApiError(404, f"no route {request.method} {path}")

    if static_dir is not None and (Path(static_dir) / "index.html").is_file():
        from fastapi.responses import FileResponse
        from fastapi.staticfiles import StaticFiles
        app.mount("/static", StaticFiles(directory=static_dir), name="static")  # not at /: unknown routes stay 404

        @app.get("/")
        async def page():
            return FileResponse(Path(static_dir) / "index.html")
    else:
        @app.get("/")
        async def index():
            return {"server": "tinyvllm", "model": ctx.model_name,
                    "endpoints": ["/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
                                  "/detokenize", "/health", "/version", "/metrics", "/state"]}
    return app
