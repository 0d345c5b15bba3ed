"""A Voice as bytes: the very safetensors file Voice.save writes, so a voice crosses a network (the server's
voice_data field) with the same checks as a file read from disk."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import VoiceError
from .voice import MAX_VOICE_BYTES, Voice


def voice_to_bytes(voice: Voice) -> bytes:
    """The bytes of `voice` saved as a voice file (check_contents refuses a voice that would not load)."""
    with tempfile.TemporaryDirectory(prefix="qwen3tts-voice-") as folder:
        return voice.save(Path(folder) / "voice.safetensors").read_bytes()


def voice_from_bytes(data: bytes, name: str = "voice_data") -> Voice:
    """The Voice in `data` (a voice file's bytes), checked as Voice.load checks a file; errors name `name`."""
    if not isinstance(data, (bytes, bytearray)):
        raise VoiceError(f"{name} must be the bytes of a voice file, not {type(data).__name__}.")
    if len(data) > MAX_VOICE_BYTES:
        raise VoiceError(f"{name} is {len(data):,} bytes; a voice file is at most {MAX_VOICE_BYTES:,} bytes.")
    with tempfile.TemporaryDirectory(prefix="qwen3tts-voice-") as folder:
        path = Path(folder) / "voice.safetensors"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            return Voice.load(path)
        except VoiceError as exc:  # the message names the temporary file: name the field instead
            raise VoiceError(str(exc).replace(str(path), name).replace(path.name, name)) from None
