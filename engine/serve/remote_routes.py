"""The endpoints a remote engine client (engine/remote/) needs beyond OpenAI's: what the engine is, so the client
can check and fill in requests as a local engine would (GET /v1/engine), and a voice made from uploaded audio,
returned as data the client keeps and sends back as voice_data (POST /v1/audio/voice)."""
from __future__ import annotations

import base64
import dataclasses

from aiohttp import web

from ..config import SAMPLE_RATE
from .api_errors import FieldError
from .app_keys import BACKEND, MODEL
from .served_model import ServedModel
from .speech import read_json
from .speech_request import reference_upload, text_field

VOICE_FIELDS = ("reference_audio", "reference_text")


async def engine_facts(request: web.Request) -> web.Response:
    """What the engine is (both backends carry its info and config: a Ray backend the replicas' facts) and how
    many requests may wait and rows decode at once: a client keeps no more requests open than may wait, so it is
    never refused for a full queue alone."""
    model: ServedModel = request.app[MODEL]
    backend = request.app[BACKEND]
    info, config = backend.engine.info, backend.engine.config
    return web.json_response({
        **model.card(), "sample_rate": SAMPLE_RATE, "defaults": dataclasses.asdict(model.defaults),
        "max_seq_len": config.max_seq_len, "model_size": info.model_size, "summary": info.summary(),
        "device": info.device, "dtype": info.dtype, "cuda_graphs": bool(info.cuda_graphs),
        "kernels": list(info.kernels), "notes": list(info.notes), "saved_voices": model.saved_voices(),
        "max_queue": backend.max_queue, "max_rows": backend.stats()["slots"]})


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
    waveform, rate = reference_upload(body["reference_audio"])
    ref_text = text_field(body, "reference_text")
    voice = await request.app[BACKEND].extract_voice(waveform, rate, ref_text if ref_text and ref_text.strip()
                                                     else None)
    return web.json_response({"object": "voice", "model": model.id, "icl": voice.is_icl,
                              "voice_data": base64.b64encode(voice.to_bytes()).decode("ascii")})
