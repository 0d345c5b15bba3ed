"""ComfyUI V3 registration of the pack: folder, status route and the node list."""
from __future__ import annotations

import logging

from . import comfy_paths, engine_cache
from .comfy_api_compat import ComfyExtension, io
from .node_generate import CustomVoice, VoiceClone, VoiceDesign
from .node_blend import BlendVoices
from .node_loader import LoadQwen3TTS
from .node_script import SaveSubtitles, Script
from .node_stream import StreamChunks
from .node_takes import PickTake
from .node_voice import ExtractSpeakerEmbedding, LoadVoice, SaveVoice

log = logging.getLogger(__name__)

NODES: list[type[io.ComfyNode]] = [LoadQwen3TTS, ExtractSpeakerEmbedding, SaveVoice, LoadVoice, VoiceClone,
                                   CustomVoice, VoiceDesign, StreamChunks, PickTake, Script, SaveSubtitles,
                                   BlendVoices]


def _register_routes() -> None:
    """GET /qwen3tts_fast/engines: the engines loaded right now (used by tests and the web UI)."""
    try:
        from aiohttp import web
        from server import PromptServer
    except ImportError:
        return
    server = getattr(PromptServer, "instance", None)
    if server is None:  # imported by a harness without a server
        return

    @server.routes.get("/qwen3tts_fast/engines")
    async def engines(request):
        return web.json_response({"engines": engine_cache.loaded()})


comfy_paths.register_folder()
_register_routes()


class Qwen3TTSExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> Qwen3TTSExtension:
    return Qwen3TTSExtension()
