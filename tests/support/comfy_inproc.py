"""ComfyUI's model management imported into the test process (--cpu), and the pack's node-side engine cache.

Reuses ComfyUI if another test already imported it (tests/nodes/test_contract.py does, with its own base
directory). The pack is imported as a bare package under a private alias, so only nodes/engine_cache.py
and what it needs run, not the pack's node registration."""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def engine_cache():
    """Yields (comfy.model_management, the pack's nodes.engine_cache module).

    If ComfyUI was not imported yet, it is imported here and forgotten again afterwards (its modules are
    removed from sys.modules), so a later test that imports ComfyUI with its own arguments (another base
    directory) gets a fresh import, whatever order the tests run in."""
    comfy_dir = os.environ["COMFYUI_DIR"]
    mine = "comfy.model_management" not in sys.modules
    before, argv, path = set(sys.modules), sys.argv, list(sys.path)
    if mine:
        sys.path.insert(0, comfy_dir)
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
    try:
        yield sys.modules["comfy.model_management"], importlib.import_module(f"{ALIAS}.nodes.engine_cache")
    finally:
        ours = _top_level_names(comfy_dir) - {"tests"} if mine else set()  # `tests` here is this pack's
        for name in set(sys.modules) - before:
            top = name.split(".")[0]
            if top == ALIAS or top in ours:
                del sys.modules[name]
        sys.path[:] = path


def _top_level_names(folder: str) -> set:
    """Names of the modules and packages at the top of a source tree (ComfyUI's: comfy, folder_paths, ...)."""
    return {Path(e).stem for e in os.listdir(folder) if e.endswith(".py") or os.path.isdir(os.path.join(folder, e))}
