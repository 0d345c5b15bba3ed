"""The endpoints a remote engine client (engine/remote/) needs beyond OpenAI's: what the engine is, so the client
can check and fill in requests as a local engine would (GET /v1/engine), and a voice made from uploaded audio,
returned as data the client keeps and sends back as voice_data (POST /v1/audio/voice)."""
from __future__ import annotations

import base64
import dataclasses

from aiohttp import web

from ..config import SAMPLE_RATE
from ..engine_config import EngineConfig
from .api_errors import FieldError
from .app_keys import BACKEND, MODEL
from .served_model import ServedModel
from .speech import read_json
from .speech_request import _reference, _text

VOICE_FIELDS = ("reference_audio", "reference_text")


async def engine_facts(request: web.Request) -> web.Response:
    model: ServedModel = request.app[MODEL]
    backend = request.app[BACKEND]
    engine = getattr(backend, "engine", None)  # a backend without a local engine: the defaults
    info = getattr(engine, "info", None)
    config = getattr(engine, "config", None)
    return web.json_response({
        **model.card(), "sample_rate": SAMPLE_RATE, "defaults": dataclasses.asdict(model.defaults),
        "max_seq_len": getattr(config, "max_seq_len", EngineConfig.max_seq_len),
        "model_size": getattr(info, "model_size", ""), "summary": info.summary() if info is not None else "",
        "device": getattr(info, "device", ""), "dtype": getattr(info, "dtype", ""),
        "cuda_graphs": bool(getattr(info, "cuda_graphs", False)), "kernels": list(getattr(info, "kernels", [])),
        "notes": list(getattr(info, "notes", [])), "saved_voices": model.saved_voices(),
        **_capacity(backend)})


def _capacity(backend) -> dict:
    """How many requests may wait (max_queue) and how many rows decode at once (max_rows), where the backend
    says; a client keeps no more requests open than may wait, so it is never refused for a full queue alone."""
    scheduler = getattr(backend, "scheduler", None)
    max_queue = getattr(scheduler, "max_queue", getattr(backend, "max_queue", None))
    try:
        max_rows = backend.stats()["slots"]
    except (AttributeError, KeyError, TypeError):
        max_rows = None
    return {"max_queue": max_queue, "max_rows": max_rows}


async def extract_voice(request: web.Request) -> web.Response:
    model: ServedModel = request.app[MODEL]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise FieldError(None, f"the request body must be a JSON object, not {type(body).__name__}.")
    for name in body:
        if name not in VOICE_FIELDS:
            raise FieldError(name, f"unknown field '{name}'. The fields are: {', '.join(VOICE_FIELDS)}.")
    if model.mode != "clone":
        raise FieldError(None, f"this server's model is {model.model_type}; only Base checkpoints extract voices. "
                               "Serve a Base checkpoint for voice cloning.")
    if body.get("reference_audio") is None:
        raise FieldError("reference_audio", "reference_audio is required: the reference recording, a WAV file in "
                                            "base64.")
    waveform, rate = _reference(body["reference_audio"])
    ref_text = _text(body, "reference_text")
    voice = await request.app[BACKEND].extract_voice(waveform, rate, ref_text if ref_text and ref_text.strip()
                                                     else None)
    return web.json_response({"object": "voice", "model": model.id, "icl": voice.is_icl,
                              "voice_data": base64.b64encode(voice.to_bytes()).decode("ascii")})
