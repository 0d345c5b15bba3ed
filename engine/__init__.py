"""Qwen3-TTS-12Hz inference engine (no ComfyUI, no transformers). Public names are imported lazily,
so `import engine` costs nothing until one of them is used."""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Engine": "engine", "EngineConfig": "engine_config", "EngineInfo": "loading", "Result": "engine",
    "Chunk": "engine", "BatchItem": "engine", "Scheduler": "scheduler", "Ticket": "ticket",
    "Request": "prompt", "SamplingParams": "sampling", "check_take_range": "sampling", "Voice": "voice",
    "blend_voices": "voice_blend", "errors": None,
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute '{name}'")
    if name == "errors":
        return importlib.import_module(".errors", __name__)
    return getattr(importlib.import_module("." + _EXPORTS[name], __name__), name)
