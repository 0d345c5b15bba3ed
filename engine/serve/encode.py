"""Audio as the API sends it: 16-bit PCM at 24 kHz, mono, in a WAV or FLAC file, raw, or base64 WAV in JSON."""
from __future__ import annotations

import base64
import io

import numpy as np

from .. import audio
from ..config import SAMPLE_RATE

CONTENT_TYPES = {"wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/pcm", "json": "application/json"}
PCM_HEADERS = {"X-Sample-Rate": str(SAMPLE_RATE), "X-Channels": "1", "X-Sample-Format": "s16le"}


def pcm_bytes(samples) -> bytes:
    """Raw little-endian 16-bit samples; the same rounding as every other format, so a stream's bytes, joined,
    equal the whole response's."""
    return audio.pcm16(samples).tobytes()


def encode(fmt: str, samples) -> bytes:
    """One take's samples [T] (float, 24 kHz) as a wav, flac or pcm body."""
    if fmt == "pcm":
        return pcm_bytes(samples)
    if fmt == "wav":
        return audio.wav_bytes(samples, SAMPLE_RATE)
    if fmt == "flac":
        import soundfile  # speech_request checked it is installed before the request ran

        out = io.BytesIO()
        soundfile.write(out, audio.pcm16(samples)[0], SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        return out.getvalue()
    raise ValueError(f"no audio encoder for {fmt!r}")


def takes_json(model_id: str, seed: int, first_take: int, takes: list, fmt: str = "wav", pack=None) -> dict:
    """response_format json: every take as base64 of `pack(samples)` (default: a 16-bit WAV file; `fmt` names
    it), labelled with its take index of the seed."""
    pack = pack or (lambda t: audio.wav_bytes(t, SAMPLE_RATE))
    return {"object": "audio.speech", "model": model_id, "sample_rate": SAMPLE_RATE, "format": fmt, "seed": seed,
            "takes": [{"take": first_take + i, "duration_s": round(int(np.asarray(t).shape[-1]) / SAMPLE_RATE, 4),
                       "audio": base64.b64encode(pack(t)).decode("ascii")}
                      for i, t in enumerate(takes)]}
