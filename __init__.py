"""Qwen3-TTS Fast for ComfyUI: node pack entry point (ComfyUI >= 0.3.48, V3 node API; see docs/COMPATIBILITY.md).

Importing this does nothing heavy: it registers the model folder, one status route and the node
classes. Models load only when a workflow runs. If the nodes cannot be imported the error is logged with
the pack's name and re-raised, so ComfyUI reports "IMPORT FAILED" instead of silently losing nodes.
"""
import importlib.util
import logging
import sys

WEB_DIRECTORY = "./web"
_log = logging.getLogger(__name__)

if importlib.util.find_spec("comfy_api") is None:
    # Not inside ComfyUI (e.g. a test runner walking the repo): nothing to register.
    if "comfy" in sys.modules:
        _log.error("Qwen3-TTS Fast needs ComfyUI >= 0.3.48 (the V3 node API); its nodes are NOT registered. "
                   "Update ComfyUI.")
else:
    try:
        from .nodes.extension import comfy_entrypoint  # noqa: F401  (nodes/comfy_api_compat.py picks the API module)
    except Exception:
        _log.exception("Qwen3-TTS Fast: the nodes failed to import; no Qwen3-TTS nodes are available")
        raise
