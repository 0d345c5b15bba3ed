"""The only module of the pack that imports ComfyUI's V3 node API (`comfy_api`); every node imports `io`, `ui`
and `ComfyExtension` from here.

ComfyUI's docs call `comfy_api.latest` a moving target and recommend a numbered module: `comfy_api.v0_0_2`
(ComfyUI 0.3.75 up to the newest release checked, see docs/COMPATIBILITY.md). A ComfyUI that has no
`v0_0_2` (older than the numbered modules, or one that has retired it) gets `comfy_api.latest`;
`API_MODULE` says which one was taken and the pack logs it once at import.

What changed between the versions the pack runs on, and how it is bridged here:
* `Input(advanced=...)` (inputs folded under "advanced" in the newest frontend) exists only in newer
  ComfyUI; `advanced()` sets it there and puts it into `extra_dict` on 0.3.75, so both backends send the
  same `"advanced": true` in /object_info.
"""
from __future__ import annotations

import importlib
import inspect
import logging

log = logging.getLogger(__name__)

PINNED = "comfy_api.v0_0_2"
FALLBACK = "comfy_api.latest"


def _load():
    for name in (PINNED, FALLBACK):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a broken import inside ComfyUI: let it surface as it is
                raise
    raise ImportError(f"Qwen3-TTS Fast needs ComfyUI >= 0.3.48 (the V3 node API: {PINNED} or {FALLBACK}); "
                      "update ComfyUI")


_api = _load()
API_MODULE: str = _api.__name__
io = _api.io
ui = _api.ui  # comfy_api.v0_0_3 and later load it lazily through a module __getattr__
ComfyExtension = _api.ComfyExtension

ADVANCED_KEYWORD: bool = "advanced" in inspect.signature(io.Input.__init__).parameters

log.info("Qwen3-TTS Fast: ComfyUI node API from %s (advanced inputs as %s)", API_MODULE,
         "keyword" if ADVANCED_KEYWORD else "extra_dict")


def advanced(inp):
    """Mark an input as advanced on any supported ComfyUI and return it:
    `advanced(io.Int.Input("name", ...))`. Newer ComfyUI reads `Input.advanced`; on 0.3.75 the typed
    inputs take no such keyword (nor extra_dict), so the flag goes into the base class's `extra_dict`."""
    if ADVANCED_KEYWORD:
        inp.advanced = True
    else:
        inp.extra_dict["advanced"] = True
    return inp


__all__ = ["ADVANCED_KEYWORD", "API_MODULE", "ComfyExtension", "advanced", "io", "ui"]
