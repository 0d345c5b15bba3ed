"""Helpers shared by the ComfyUI-tier tests (tests/nodes, tests/integration)."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

PACK = Path(__file__).resolve().parents[2]
EXAMPLE_WORKFLOWS = sorted(p.stem for p in (PACK / "example_workflows").glob("*.json"))  # their names
COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "")
SCRIPTS = PACK / "scripts"
ARTIFACTS = PACK / "tests" / "artifacts"


def comfy_missing() -> str | None:
    """Why the ComfyUI test environment is unusable, or None when it is set up."""
    if not COMFYUI_DIR:
        return ("ComfyUI test environment not set up: run scripts/setup_comfyui.sh VENV WORK, then pytest with "
                "VENV/bin/python and COMFYUI_DIR=WORK/ComfyUI")
    if not (Path(COMFYUI_DIR) / "main.py").is_file():
        return f"COMFYUI_DIR={COMFYUI_DIR} holds no ComfyUI (main.py missing)"
    for mod in ("aiohttp", "av", "torchaudio"):
        if importlib.util.find_spec(mod) is None:
            return f"module {mod} missing: run pytest with the python of the venv setup_comfyui.sh prepared"
    return None


def need(why: str | None) -> None:
    """A missing tool or tier (`why`, None: nothing is missing): skip the test, or fail it under
    QWEN3TTS_STRICT_TESTS=1 (CI), where everything must be there."""
    import pytest

    if not why:
        return
    if os.environ.get("QWEN3TTS_STRICT_TESTS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def skip_comfy_tier(items, here: Path) -> None:
    """Skips for the tests in folder `here` (a pytest_collection_modifyitems hook's items): `test_unit_*.py` need
    only torch; every other test needs the real ComfyUI; `engine`-marked ones also the engine. With
    QWEN3TTS_STRICT_TESTS=1 (CI) a missing ComfyUI is a failure instead."""
    import pytest

    why_comfy = comfy_missing()
    if why_comfy and os.environ.get("QWEN3TTS_STRICT_TESTS") == "1":
        raise pytest.UsageError(f"QWEN3TTS_STRICT_TESTS=1 but {why_comfy}")
    why_engine = None
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


def engine_missing() -> str | None:
    try:
        if str(PACK) not in sys.path:
            sys.path.append(str(PACK))
        importlib.import_module("engine.checkpoint.writer")
        importlib.import_module("engine.engine")
    except Exception as exc:  # the engine is developed in parallel; report exactly why it is unusable
        return f"engine not usable yet ({type(exc).__name__}: {exc})"
    return None


def load_pure(module: str):
    """Import nodes/<module>.py without ComfyUI (nodes/ as a package under a private alias)."""
    alias = "qwen3tts_pack_nodes"
    if alias not in sys.modules:
        spec = importlib.util.spec_from_file_location(alias, PACK / "nodes" / "__init__.py",
                                                      submodule_search_locations=[str(PACK / "nodes")])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[alias] = pkg
        spec.loader.exec_module(pkg)
    return importlib.import_module(f"{alias}.{module}")


def load_script(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_comfy(base: Path, log_name: str = "comfyui.log", object_info: bool = False):
    """A headless ComfyUI on `base` (a --base-directory) at a free port, up before the block and stopped after
    it: the client, carrying base, proc and port (and /object_info, when asked)."""
    client = load_script("comfy_client")
    port = free_port()
    proc = client.start_comfy(Path(COMFYUI_DIR), base, port, base / log_name)
    c = client.Comfy(port)
    try:
        c.wait_up(proc)
        if object_info:
            c.object_info = c.get("/object_info")
        c.base, c.proc, c.port = base, proc, port
        yield c
    finally:
        client.stop_comfy(proc)


def chromium_path() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def read_audio(path: Path):
    """(samples as float64 [n], sample rate) of an audio file ComfyUI saved (PyAV, as ComfyUI itself)."""
    import av
    import numpy as np

    with av.open(str(path)) as f:
        stream = f.streams.audio[0]
        frames = [fr.to_ndarray() for fr in f.decode(stream)]
        sr = stream.rate
    x = np.concatenate(frames, axis=-1).astype(np.float64)
    if np.issubdtype(frames[0].dtype, np.integer):
        x /= float(np.iinfo(frames[0].dtype).max) + 1
    return x.reshape(-1), sr
