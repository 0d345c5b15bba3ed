"""nodes/comfy_api_compat.py picks ComfyUI's V3 API module: the pinned comfy_api.v0_0_2 where it exists, else
comfy_api.latest, else a clear ImportError; and `advanced()` works with and without Input(advanced=).
Each case imports the shim in a subprocess next to a small fake `comfy_api` package of that shape."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parents[2] / "nodes" / "comfy_api_compat.py"

IO_OLD = """
class Input:
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, extra_dict=None):
        self.extra_dict = extra_dict or {}
"""
IO_NEW = """
class Input:
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, extra_dict=None,
                 raw_link=None, advanced=None):
        self.extra_dict, self.advanced = extra_dict or {}, advanced
"""
API_INIT = "from . import io, ui\nclass ComfyExtension: pass\n"
LAZY_UI_INIT = ("from comfy_api.latest import io, ComfyExtension\nimport importlib\n"
                "def __getattr__(name):\n    if name == 'ui':\n        return importlib.import_module('comfy_api.latest.ui')\n"
                "    raise AttributeError(name)\n")

PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import importlib.util
spec = importlib.util.spec_from_file_location("shim", sys.argv[2])
m = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(m)
except ImportError as exc:
    print(json.dumps({"error": str(exc)})); raise SystemExit
print(json.dumps({"module": m.API_MODULE, "io": m.io.__name__, "ui": m.ui.__name__,
                  "keyword": m.ADVANCED_KEYWORD, "advanced": vars(m.advanced(m.io.Input("x", extra_dict={"k": 1})))}))
"""


def _tree(root: Path, modules: dict[str, str]) -> Path:
    for name, text in modules.items():
        path = root / (name.replace(".", "/") + "/__init__.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _probe(root: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(root), str(SHIM)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _api(version: str, io_text: str, init: str = API_INIT) -> dict[str, str]:
    return {f"comfy_api.{version}": init, f"comfy_api.{version}.io": io_text, f"comfy_api.{version}.ui": ""}


@pytest.mark.parametrize("shape, expect", [
    ("0.3.75", ("comfy_api.v0_0_2", False)),          # v0_0_2 and latest, Input without advanced=
    ("newest", ("comfy_api.v0_0_2", True)),           # Input(advanced=), v0_0_3 beside v0_0_2
    ("latest only", ("comfy_api.latest", True)),      # a ComfyUI that retired v0_0_2
])
def test_module_choice_and_advanced(tmp_path, shape, expect):
    modules = {"comfy_api": ""}
    if shape == "0.3.75":
        modules |= _api("latest", IO_OLD) | _api("v0_0_2", IO_OLD)
    elif shape == "newest":
        modules |= _api("latest", IO_NEW) | _api("v0_0_2", IO_NEW) | {"comfy_api.v0_0_3": LAZY_UI_INIT}
    else:
        modules |= _api("latest", IO_NEW)
    got = _probe(_tree(tmp_path, modules))
    assert (got["module"], got["keyword"]) == expect
    assert got["io"].startswith(got["module"]) and got["ui"].startswith(got["module"])
    if got["keyword"]:
        assert got["advanced"] == {"advanced": True, "extra_dict": {"k": 1}}
    else:
        assert got["advanced"] == {"extra_dict": {"k": 1, "advanced": True}}


def test_no_v3_api_is_a_clear_error(tmp_path):
    got = _probe(_tree(tmp_path, {"comfy_api": "", "comfy_api.input": ""}))
    assert "needs ComfyUI >= 0.3.48" in got["error"]


def test_a_broken_import_inside_comfyui_is_not_masked(tmp_path):
    modules = {"comfy_api": "", "comfy_api.v0_0_2": "import comfy_api_missing_dependency\n"} | _api("latest", IO_OLD)
    got = _probe(_tree(tmp_path, modules))
    assert "comfy_api_missing_dependency" in got["error"] and "needs ComfyUI" not in got["error"]
