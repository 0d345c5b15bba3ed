"""The engine imports and runs with transformers, accelerate, gradio, sox, onnxruntime, librosa,
torchaudio (and ComfyUI, qwen_tts) not installed: a subprocess runs on a copy of site-packages without them."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = ["transformers", "accelerate", "gradio", "sox", "onnxruntime", "librosa", "torchaudio", "qwen_tts",
          "comfy", "comfy_api", "folder_paths", "server", "soundfile", "huggingface_hub"]

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
