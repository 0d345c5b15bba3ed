"""ComfyUI's model management imported into the test process (--cpu), and the pack's node-side engine cache.

Reuses ComfyUI if another test already imported it (tests/comfy/test_contract.py does, with its own base
directory). The pack is imported as a bare package under a private alias, so only nodes/engine_cache.py
and what it needs run, not the pack's node registration."""
from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

PACK = Path(__file__).resolve().parents[2]
ALIAS = "qwen3tts_reliability_pack"


def comfy_missing() -> str | None:
    comfy_dir = os.environ.get("COMFYUI_DIR", "")
    if not comfy_dir or not (Path(comfy_dir) / "main.py").is_file():
        return "needs ComfyUI: set COMFYUI_DIR (scripts/setup_comfyui.sh makes one)"
    return None


def engine_cache():
    """(comfy.model_management, the pack's nodes.engine_cache module)."""
    if "comfy.model_management" not in sys.modules:
        comfy_dir = os.environ["COMFYUI_DIR"]
        if comfy_dir not in sys.path:
            sys.path.insert(0, comfy_dir)
        argv = sys.argv
        sys.argv = ["main.py", "--cpu"]
        try:
            import comfy.options

            comfy.options.enable_args_parsing()
            importlib.import_module("comfy.model_management")
        finally:
            sys.argv = argv
    if ALIAS not in sys.modules:
        pkg = types.ModuleType(ALIAS)
        pkg.__path__ = [str(PACK)]
        sys.modules[ALIAS] = pkg
    return sys.modules["comfy.model_management"], importlib.import_module(f"{ALIAS}.nodes.engine_cache")
