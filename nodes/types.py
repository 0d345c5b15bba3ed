"""The pack's custom socket types."""
from .comfy_api_compat import io

Qwen3TTSModel = io.Custom("QWEN3TTS_MODEL")  # a ModelRef (nodes/engine_cache.py), not the engine itself
Qwen3TTSVoice = io.Custom("QWEN3TTS_VOICE")  # an engine Voice: speaker embedding [+ ICL codes and text]

CATEGORY = "audio/Qwen3-TTS"
PREFIX = "Qwen3TTSFast_"  # node ids: stable, pack-prefixed
EVENT = "qwen3tts_fast.stream"  # custom websocket event of StreamChunks
