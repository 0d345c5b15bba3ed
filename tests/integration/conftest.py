"""Integration tests: the pack in a real ComfyUI 0.3.75, over HTTP and in a browser.

* Every test but `test_unit_*.py` needs a real ComfyUI made by `scripts/setup_comfyui.sh VENV WORK`: run pytest
  with that venv's python and `COMFYUI_DIR=WORK/ComfyUI`. Without it they are skipped, with the reason.
* Tests that generate audio also need the engine's random-checkpoint writer; without it they skip.
* The browser test needs Debian's `chromium` (or CHROMIUM=/path).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support._q3support import (
    ARTIFACTS,
    PACK,
    comfy_missing,
    load_script,
    need,
    running_comfy,
    skip_comfy_tier,
)


def pytest_collection_modifyitems(config, items):
    skip_comfy_tier(items, Path(__file__).resolve().parent)
    # The browser matrix runs grouped by frontend, so each ComfyUI of test_browser.py starts once.
    slots = [i for i, it in enumerate(items) if it.fspath.basename == "test_browser.py"]
    grouped = sorted((items[i] for i in slots),
                     key=lambda it: ["bundled", "newest"].index(it.callspec.params["frontend"])
                     if hasattr(it, "callspec") and "frontend" in it.callspec.params else -1)
    for i, it in zip(slots, grouped):
        items[i] = it


@pytest.fixture(scope="session")
def comfy_base(tmp_path_factory):
    """A ComfyUI --base-directory: custom_nodes/ -> this pack, tiny checkpoints, the reference clip (its users are
    `engine`-marked, so they are skipped at collection when the engine cannot run)."""
    return _new_base(tmp_path_factory.mktemp("comfy_base"))


def _new_base(base):
    """The pack linked into custom_nodes/, tiny checkpoints and the reference clip."""
    client = load_script("comfy_client")
    (base / "custom_nodes").mkdir()
    os.symlink(PACK, base / "custom_nodes" / "qwen3-tts-fast")
    client.install_test_checkpoints(base / "models")
    client.install_reference_audio(base / "input")
    return base


@pytest.fixture(scope="module")
def prepare_base():
    """What a test module adds to its server's base directory before ComfyUI starts (override it in the module:
    a fixture of this name returning a function of the base directory)."""
    return lambda base: None


@pytest.fixture(scope="module")
def server(tmp_path_factory, prepare_base):
    """A headless ComfyUI of the module's own, on a fresh base directory: the pack, tiny checkpoints, the reference
    clip, an empty voices folder and what `prepare_base` adds. The client carries base, proc and port."""
    need(comfy_missing())
    base = _new_base(tmp_path_factory.mktemp("reliability_comfy"))
    (base / "models" / "qwen3_tts" / "voices").mkdir()
    prepare_base(base)
    with running_comfy(base) as c:
        yield c


@pytest.fixture(scope="session")
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
