"""The pack's node modules inside a real, in-process ComfyUI (the way tests/nodes/test_contract.py loads it).

If ComfyUI is already imported in this process (tests/nodes/test_contract.py ran first), it and the pack are
reused: ComfyUI parses its command line once per process, so a second base directory is not possible.
"""
from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
from pathlib import Path

PACK = Path(__file__).resolve().parents[2]
COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "")


def missing() -> str | None:
    if not COMFYUI_DIR or not (Path(COMFYUI_DIR) / "main.py").is_file():
        return "the node surface needs a ComfyUI checkout: set COMFYUI_DIR (scripts/setup_comfyui.sh makes one)"
    for mod in ("aiohttp", "av"):
        if importlib.util.find_spec(mod) is None:
            return f"module {mod} missing: run pytest with the venv scripts/setup_comfyui.sh prepared"
    return None


def pack_module(rel: str):
    """The pack's own module for PACK/<rel> (e.g. 'nodes/runner.py'), as ComfyUI loaded it: under the pack's
    package name, not the top-level `engine` the tests import (same file, different classes)."""
    dotted = rel[: -len(".py")].replace("/", ".")
    init = str(PACK / "__init__.py")
    for name, mod in list(sys.modules.items()):
        if getattr(mod, "__file__", None) == init and f"{name}.nodes.runner" in sys.modules:
            return importlib.import_module(f"{name}.{dotted}")
    raise LookupError(f"the pack at {PACK} is not loaded")


def load_pack(base: Path) -> None:
    """Import ComfyUI (base directory `base`, CPU) unless it is already imported, then load the pack."""
    if COMFYUI_DIR not in sys.path:
        sys.path.insert(0, COMFYUI_DIR)
    if "folder_paths" not in sys.modules:
        sys.argv = ["main.py", "--cpu", "--base-directory", str(base)]
        import comfy.options

        comfy.options.enable_args_parsing()
        import utils.extra_config  # noqa: F401  (must precede `nodes`)
    import nodes
    import server

    try:
        pack_module("nodes/runner.py")
        return
    except LookupError:
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    if getattr(server.PromptServer, "instance", None) is None:
        server.PromptServer(loop)
    if not loop.run_until_complete(nodes.load_custom_node(str(PACK))):
        raise RuntimeError(f"ComfyUI could not load the pack at {PACK}")
