"""The aiohttp application: routes, the API key check, and errors as JSON (a request never ends the server)."""
from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass

from aiohttp import web

from ..config import SAMPLE_RATE
from .api_errors import FieldError, error_body, status_and_body
from .app_keys import BACKEND, MODEL, SETTINGS
from .backend import Backend
from .remote_routes import engine_facts, extract_voice
from .served_model import ServedModel
from .speech import speech

log = logging.getLogger(__name__)
OPEN_PATHS = ("/health",)  # answer without the API key: a load balancer's probe carries none


@dataclass(frozen=True)
class Settings:
    api_key: str | None = None
    chunk_frames: int = 8
    first_chunk_frames: int = 1
    max_body: int = 32 << 20  # bytes of a request body: room for a minute of reference audio as base64 WAV


def _json_error(status: int, body: dict, headers: dict | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except asyncio.CancelledError:  # the client left; the handler has cancelled its request
        raise
    except web.HTTPException as exc:  # the router's 404 and 405, as JSON
        if exc.status < 400:
            raise
        return _json_error(exc.status, error_body(f"{exc.reason}: {request.method} {request.path}. The endpoints "
                                                  "are POST /v1/audio/speech, GET /v1/models, GET /v1/audio/voices, "
                                                  "POST /v1/audio/voice, GET /v1/engine and GET /health.", "invalid_request_error"))
    except Exception as exc:
        status, body = status_and_body(exc)
        if status >= 500 and not isinstance(exc, FieldError):
            log.exception("request %s %s failed", request.method, request.path)
        return _json_error(status, body, {"Retry-After": "1"} if status == 503 else None)


@web.middleware
async def api_key(request: web.Request, handler):
    key = request.app[SETTINGS].api_key
    if key is None or request.path in OPEN_PATHS:
        return await handler(request)
    given = request.headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        what = "no API key was sent" if not given else "the API key is wrong"
        return _json_error(401, error_body(f"{what}; send the header 'Authorization: Bearer <key>' with the key "
                                           "the server was started with.", "authentication_error",
                                           code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})
    return await handler(request)


def device_memory(engine) -> int | None:
    """Bytes of tensors the engine's CUDA device holds (torch's allocator), for telling a leak from a steady
    state; None off CUDA, where torch does not count them, and for replicas (serve --ray: each has its own)."""
    device = getattr(engine, "device", None)  # a Ray backend's `engine` is only the replicas' facts
    if device is None or device.type != "cuda":
        return None
    import torch

    return torch.cuda.memory_allocated(device)


async def health(request: web.Request) -> web.Response:
    backend: Backend = request.app[BACKEND]
    replicas = getattr(backend, "replicas", None)  # a backend of several engines (serve --ray) lists them
    extra = {"replicas": await replicas()} if replicas is not None else {}
    stats = backend.stats()
    return web.json_response({"status": "ok", "model": request.app[MODEL].id, "busy": stats["running"] > 0,
                              "queued": stats["waiting"], "running": stats["running"], "rows": stats["rows"],
                              "max_rows": stats["slots"], "requests": vars(backend.counts),
                              "memory": device_memory(getattr(backend, "engine", None)), **extra})


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [request.app[MODEL].card()]})


async def voices(request: web.Request) -> web.Response:
    model: ServedModel = request.app[MODEL]
    return web.json_response({"model": model.id, "speakers": model.speakers, "saved_voices": model.saved_voices(),
                              "sample_rate": SAMPLE_RATE})


def build_app(backend: Backend, model: ServedModel, settings: Settings) -> web.Application:
    app = web.Application(middlewares=[errors_as_json, api_key], client_max_size=settings.max_body)
    app[BACKEND], app[MODEL], app[SETTINGS] = backend, model, settings
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/audio/voices", voices)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/engine", engine_facts)
    app.router.add_post("/v1/audio/voice", extract_voice)
    return app
