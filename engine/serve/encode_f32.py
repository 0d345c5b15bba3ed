"""sample_format f32: the engine's float samples exactly, as raw little-endian 32-bit floats (pcm, stream) or
base64 of them in json, so a client gets the very audio a local engine call returns; json adds each take's codec
codes (base64 of little-endian int16 [frames, 16]), the tokens that audio decodes from."""
from __future__ import annotations

import base64

import numpy as np

from ..config import SAMPLE_RATE
from . import encode

F32_HEADERS = {"X-Sample-Rate": str(SAMPLE_RATE), "X-Channels": "1", "X-Sample-Format": "f32le"}


def f32_bytes(samples) -> bytes:
    return np.asarray(samples, dtype="<f4").reshape(-1).tobytes()


def takes_json(model_id: str, seed: int, first_take: int, takes: list, sample_format: str = "s16",
               codes: list | None = None) -> dict:
    """response_format json: every take as base64 WAV (s16) or base64 raw f32le with its codes (f32)."""
    if sample_format == "s16":
        return encode.takes_json(model_id, seed, first_take, takes)
    body = encode.takes_json(model_id, seed, first_take, takes, fmt="f32le", pack=f32_bytes)
    for take, frames in zip(body["takes"], codes or []):
        take["codes"] = base64.b64encode(np.asarray(frames, dtype="<i2").tobytes()).decode("ascii")
    return body
