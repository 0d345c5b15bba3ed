"""ComfyUI-tier tests of the node pack.

* `test_unit_*.py` test the pack's pure helpers and always run (torch is the only requirement).
* Every other test needs a real ComfyUI 0.3.75 made by `scripts/setup_comfyui.sh VENV WORK`: run pytest
  with that venv's python and `COMFYUI_DIR=WORK/ComfyUI`. Without it they are skipped, with the reason.
* Tests that generate audio also need the engine's random-checkpoint writer; without it they skip.
* The browser test needs Debian's `chromium` (or CHROMIUM=/path).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _q3support import ARTIFACTS, PACK, comfy_missing, engine_missing, load_script  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "comfy: needs the real ComfyUI test environment")
    config.addinivalue_line("markers", "engine: needs the engine and its random-checkpoint writer")
    config.addinivalue_line("markers", "browser: needs a headless chromium")


def pytest_collection_modifyitems(config, items):
    why_comfy = comfy_missing()
    if why_comfy and os.environ.get("QWEN3TTS_STRICT_TESTS") == "1":  # CI: a missing tier is a failure
        raise pytest.UsageError(f"QWEN3TTS_STRICT_TESTS=1 but {why_comfy}")
    why_engine = None
    here = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if path.parent != here:
            continue
        if not path.name.startswith("test_unit_") and why_comfy:
            item.add_marker(pytest.mark.skip(reason=why_comfy))
        elif item.get_closest_marker("engine"):
            if why_engine is None:
                why_engine = engine_missing() or ""
            if why_engine:
                item.add_marker(pytest.mark.skip(reason=why_engine))
    # The browser matrix runs grouped by frontend, so each ComfyUI of test_browser.py starts once.
    slots = [i for i, it in enumerate(items) if it.fspath.basename == "test_browser.py"]
    grouped = sorted((items[i] for i in slots),
                     key=lambda it: ["bundled", "newest"].index(it.callspec.params["frontend"])
                     if hasattr(it, "callspec") and "frontend" in it.callspec.params else -1)
    for i, it in zip(slots, grouped):
        items[i] = it


@pytest.fixture(scope="session")
def comfy_base(tmp_path_factory):
    """A ComfyUI --base-directory: custom_nodes/ -> this pack, tiny checkpoints, the reference wav (its users are
    `engine`-marked, so they are skipped at collection when the engine cannot run)."""
    client = load_script("comfy_client")
    base = tmp_path_factory.mktemp("comfy_base")
    (base / "custom_nodes").mkdir()
    os.symlink(PACK, base / "custom_nodes" / "qwen3-tts-fast")
    client.install_test_checkpoints(base / "models")
    client.install_reference_audio(base / "input")
    return base


@pytest.fixture(scope="session")
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
