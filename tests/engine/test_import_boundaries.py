"""The engine imports and runs with transformers, accelerate, gradio, sox, onnxruntime, librosa,
torchaudio (and ComfyUI, qwen_tts, ray) not installed: a subprocess runs on a copy of site-packages without them."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = ["transformers", "accelerate", "gradio", "sox", "onnxruntime", "librosa", "torchaudio", "qwen_tts",
          "comfy", "comfy_api", "folder_paths", "server", "soundfile", "huggingface_hub", "ray"]

SCRIPT = r"""
import json, sys
HIDDEN = set(json.loads(sys.argv[1]))
import engine
assert "torch" not in sys.modules, "import engine must stay light"
import numpy as np
from engine import Engine, Request
ckpts = json.loads(sys.argv[2])
out = {}
e = Engine.load(ckpts["custom_voice"], device="cpu", dtype="fp32")
p = e.defaults.replace(max_new_tokens=4)
out["custom"] = e.generate(Request(mode="custom", text="Hidden imports.", speaker="ryan"), params=p).audio.shape[1]
out["stream"] = sum(c.audio.numel() for c in e.stream(Request(mode="custom", text="Hi.", speaker="ryan"), params=p, chunk_frames=2))
d = Engine.load(ckpts["voice_design"], device="cpu", dtype="fp32")
out["design"] = d.generate(Request(mode="design", text="Hi.", instruct="calm"), params=p).audio.shape[1]
b = Engine.load(ckpts["base"], device="cpu", dtype="fp32")
t = np.arange(48000) / 24000
v = b.extract_voice((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 16000, ref_text="Reference text.")
out["clone"] = b.generate(Request(mode="clone", text="Hi.", voice=v), params=p).audio.shape[1]
leaked = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
out["leaked"] = leaked
print(json.dumps(out))
"""


def site_without(hidden: list, dest: Path) -> Path:
    """A copy of this interpreter's site-packages as symlinks, minus the hidden packages and their metadata,
    so to the subprocess they are simply not installed."""
    import sysconfig

    src = Path(sysconfig.get_paths()["purelib"])
    dest.mkdir()
    norm = {h.lower().replace("-", "_") for h in hidden}
    for entry in src.iterdir():
        stem = entry.name.split("-")[0].split(".")[0].lower().replace("-", "_")
        if stem in norm or entry.suffix == ".pth":
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def test_engine_runs_with_heavy_packages_hidden(tiny_checkpoints, tmp_path):
    ckpts = {k: str(v) for k, v in tiny_checkpoints.items()}
    site_dir = site_without(HIDDEN, tmp_path / "site")
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{site_dir}", "PATH": os.environ.get("PATH", "")}
    probe = subprocess.run([sys.executable, "-S", "-c", "import transformers"], env=env, capture_output=True)
    assert probe.returncode != 0, "transformers must be unimportable in the hidden environment"
    proc = subprocess.run([sys.executable, "-S", "-c", SCRIPT, json.dumps(HIDDEN), json.dumps(ckpts)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["leaked"] == []
    assert out["custom"] == out["design"] == out["clone"] == out["stream"] == 4 * 1920


def test_engine_source_never_imports_forbidden_packages():
    """A static check as well: no engine module imports a forbidden package, at any depth of the code."""
    forbidden = {"transformers", "accelerate", "gradio", "sox", "onnxruntime", "librosa", "torchaudio", "comfy",
                 "folder_paths", "qwen_tts"}
    for path in (ROOT / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for n in names:
                assert n.split(".")[0] not in forbidden, f"{path}: imports {n}"


def _imported_modules(path: Path) -> list[str]:
    """Absolute modules a file imports: import statements, plus importlib.import_module("...") literals."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.append(node.args[0].value)
    return names


def test_only_the_shim_imports_comfy_api():
    """ComfyUI's V3 node API is reached through nodes/comfy_api_compat.py alone, so a rename in a newer ComfyUI
    is handled in one place (docs/COMPATIBILITY.md)."""
    shim = ROOT / "nodes" / "comfy_api_compat.py"
    files = [ROOT / "__init__.py", *(ROOT / "nodes").rglob("*.py"), *(ROOT / "engine").rglob("*.py"),
             *(ROOT / "scripts").rglob("*.py")]
    offenders = [f"{p.relative_to(ROOT)}: {n}" for p in files if p != shim
                 for n in _imported_modules(p) if n.split(".")[0] == "comfy_api"]
    assert offenders == []


# The engine's layers, lowest first: a module imports only from its own layer or below. `kernels` holds the Triton
# kernels and their torch references; `model` the modules, the codec and the checkpoint code; `gpu` the CUDA-graph
# runners over them; `decode` the loop that drives a runner; `engine` the API; `cli` the command line and the HTTP
# server (`serve`), both of which load the engine from command-line options. A top-level
# module not listed here counts as `engine`, so it may not be imported from below.
LAYERS = ["base", "kernels", "model", "gpu", "decode", "engine", "cli"]
LAYER_OF = {
    "engine.errors": "base", "engine.checks": "base", "engine.config": "base", "engine.config_fields": "base",
    "engine.sampling": "base", "engine.limits": "base", "engine.files": "base", "engine.transfer": "base",
    "engine.content_key": "base",
    "engine.kept": "base",
    "engine.kernels": "kernels",
    "engine.model": "model", "engine.codec": "model", "engine.checkpoint": "model", "engine.audio": "model",
    "engine.voice": "model", "engine.voice_blend": "model", "engine.prompt": "model",
    "engine.text_tokenizer": "model", "engine.slots": "model", "engine.host_audio": "model",
    "engine.gpu": "gpu",
    "engine.decode": "decode", "engine.row_source": "decode", "engine.finished_flags": "decode",
    "engine.scheduler": "engine", "engine.ticket": "engine",
    "engine.cli": "cli", "engine.__main__": "cli", "engine.serve": "cli",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str | None:
    """The layer of an engine module (the longest listed prefix; other engine modules: "engine"), None outside."""
    if module != "engine" and not module.startswith("engine."):
        return None
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYER_OF:
            return LAYER_OF[".".join(parts[:n])]
    return "engine"


def _engine_imports(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every module `source` (module `module`) imports, at any depth of its code, relative imports resolved: for
    `from X import a` both X and X.a (a may be a submodule)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                out.append(target)
            out += [f"{target}.{a.name}" for a in node.names]
    return out


def _upward(module: str, imports: list[str]) -> list[str]:
    mine = _layer(module)
    return [f"{module} ({mine}) imports {n} ({_layer(n)})" for n in imports
            if n != "engine" and _layer(n) is not None and LAYERS.index(_layer(n)) > LAYERS.index(mine)]


def test_engine_layers_only_point_down():
    """kernels < model/codec/checkpoint < gpu < decode < engine < cli, by every engine file's imports; the package's
    own __init__ (lazy public names) is the API's door, not a layer."""
    offenders = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        if path == ROOT / "engine" / "__init__.py":
            continue
        module = _module_name(path)
        offenders += _upward(module, _engine_imports(module, path.read_text(), path.name == "__init__.py"))
    assert offenders == []


def test_engine_never_imports_nodes_or_comfy():
    """nodes/ may import the engine; the engine never imports nodes/ or ComfyUI."""
    offenders = [f"{p.relative_to(ROOT)}: {n}" for p in (ROOT / "engine").rglob("*.py") for n in _imported_modules(p)
                 if n.split(".")[0] in {"nodes", "comfy", "comfy_api", "comfy_extras", "folder_paths", "server"}]
    assert offenders == []


def test_layer_check_sees_upward_imports():
    """The check itself: a kernel module reaching up into gpu/, a gpu module into the decode loop, a model module
    into the API are each found; imports within a layer or down are not."""
    probe = "from ..gpu.fused_layers import NO_KERNELS\nfrom . import linear\nfrom .. import sampling\n"
    assert _upward("engine.kernels.probe", _engine_imports("engine.kernels.probe", probe)) == [
        "engine.kernels.probe (kernels) imports engine.gpu.fused_layers (gpu)",
        "engine.kernels.probe (kernels) imports engine.gpu.fused_layers.NO_KERNELS (gpu)"]
    assert _upward("engine.gpu.probe", _engine_imports("engine.gpu.probe", "from ..decode import prefill_into\n"))
    assert _upward("engine.codec.probe", _engine_imports("engine.codec.probe", "import engine.engine\n"))
    assert not _upward("engine.gpu.probe", _engine_imports("engine.gpu.probe", "from ..slots import prefill_into\n"))
