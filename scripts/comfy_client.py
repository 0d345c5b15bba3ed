"""Tiny stdlib client for a headless ComfyUI (start, wait, post a prompt, poll history), plus the
installer of the tiny random test checkpoints under the names the example workflows use.

Used by tests/integration/ and usable on its own:

    python scripts/comfy_client.py run COMFYUI_DIR BASE_DIR WORKFLOW.json [--port 8190]

starts ComfyUI on 127.0.0.1 with `--base-directory BASE_DIR` (custom_nodes/ must hold this pack),
installs tiny random checkpoints into BASE_DIR/models/qwen3_tts/ where no checkpoint of that name
exists, converts the UI workflow to API format against /object_info, queues it, waits for it and prints
the output files.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

PACK = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # never anything else
CHECKPOINTS = {  # folder name used by the example workflows -> model type
    "Qwen3-TTS-12Hz-0.6B-CustomVoice": "custom_voice",
    "Qwen3-TTS-12Hz-1.7B-VoiceDesign": "voice_design",
    "Qwen3-TTS-12Hz-0.6B-Base": "base",
}
TEST_MAX_NEW_TOKENS = 12  # tiny random checkpoints never emit EOS: cap every segment at 12 frames (0.96 s)
REFERENCE_AUDIO = "qwen3tts_reference.ogg"


def install_test_checkpoints(models_dir: Path, max_new_tokens: int = TEST_MAX_NEW_TOKENS) -> list[Path]:
    """Write tiny random checkpoints (EOS off, short max_new_tokens) where none exists yet."""
    if str(PACK) not in sys.path:
        sys.path.insert(0, str(PACK))
    from engine.checkpoint.writer import write_random_checkpoint

    out = []
    for name, mtype in CHECKPOINTS.items():
        target = models_dir / "qwen3_tts" / name
        if not (target / "config.json").is_file():
            write_random_checkpoint(target, "tiny", mtype)
            gen = json.loads((target / "generation_config.json").read_text())
            gen["max_new_tokens"] = max_new_tokens
            (target / "generation_config.json").write_text(json.dumps(gen, indent=2))
        out.append(target)
    return out


def install_reference_audio(input_dir: Path) -> Path:
    input_dir.mkdir(parents=True, exist_ok=True)
    dst = input_dir / REFERENCE_AUDIO
    shutil.copyfile(PACK / "example_workflows" / REFERENCE_AUDIO, dst)
    return dst


class Comfy:
    def __init__(self, port: int):
        self.url = f"http://{HOST}:{port}"
        self.client_id = uuid.uuid4().hex

    def get(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:  # noqa: S310  our http://127.0.0.1 URL
            return json.loads(r.read())

    def post(self, path: str, data: dict, timeout: float = 30):
        req = urllib.request.Request(self.url + path, data=json.dumps(data).encode(),  # noqa: S310  same local URL
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310  same local URL
                body = r.read()
                return r.status, (json.loads(body) if body else None)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def wait_up(self, proc=None, timeout: float = 120) -> None:
        t_end = time.time() + timeout
        while time.time() < t_end:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {proc.returncode}")
            try:
                self.get("/system_stats", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise TimeoutError("ComfyUI did not answer /system_stats")

    def queue(self, prompt: dict, workflow: dict | None = None):
        extra = {"extra_pnginfo": {"workflow": workflow}} if workflow else {}
        return self.post("/prompt", {"prompt": prompt, "client_id": self.client_id, "extra_data": extra})

    def wait(self, prompt_id: str, timeout: float = 600) -> dict:
        """Poll /history until the prompt finished; returns its history entry."""
        t_end = time.time() + timeout
        while time.time() < t_end:
            h = self.get(f"/history/{prompt_id}")
            if prompt_id in h and h[prompt_id].get("status", {}).get("completed") is not None:
                entry = h[prompt_id]
                if entry["status"].get("status_str") in ("success", "error"):
                    return entry
            time.sleep(0.3)
        raise TimeoutError(f"prompt {prompt_id} did not finish in {timeout} s")


def newest_frontend(comfy_dir: Path) -> Path | None:
    """WORK/frontend-newest beside WORK/ComfyUI (scripts/setup_frontend_newest.sh), or None if not installed."""
    folder = Path(comfy_dir).parent / "frontend-newest"
    return folder if (folder / "VERSIONS").is_file() else None


def start_comfy(comfy_dir: Path, base_dir: Path, port: int, log_path: Path, python: str = sys.executable,
                extra_args: tuple = (), cpu: bool = True, frontend: Path | None = None) -> subprocess.Popen:
    """Start ComfyUI headless. `frontend`: a folder made by setup_frontend_newest.sh; its frontend is served
    through --front-end-root and its workflow templates through PYTHONPATH (ahead of the venv's)."""
    cmd = [python, "main.py", *(["--cpu"] if cpu else []), "--listen", HOST, "--port", str(port),
           "--base-directory", str(base_dir), "--database-url", "sqlite:///:memory:", "--disable-auto-launch",
           *extra_args]
    env = None
    if frontend is not None:
        cmd += ["--front-end-root", str(Path(frontend) / "comfyui_frontend_package" / "static")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(frontend), os.environ.get("PYTHONPATH"))
                                                         if p))
    log = open(log_path, "w")
    # argv list, no shell, our own ComfyUI checkout
    return subprocess.Popen(cmd, cwd=comfy_dir, stdout=log, stderr=subprocess.STDOUT, env=env)  # noqa: S603


def stop_comfy(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def output_files(entry: dict, base_dir: Path) -> list[Path]:
    files = []
    for node_out in entry.get("outputs", {}).values():
        for item in node_out.get("audio", []):
            files.append(base_dir / item.get("type", "output") / item.get("subfolder", "") / item["filename"])
    return files


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "run":
        print(__doc__)
        return 2
    comfy_dir, base_dir, wf_path = Path(argv[1]), Path(argv[2]), Path(argv[3])
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8190
    sys.path.insert(0, str(PACK / "scripts"))
    from ui_to_api import convert

    install_test_checkpoints(base_dir / "models")
    install_reference_audio(base_dir / "input")
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    proc = start_comfy(comfy_dir, base_dir, port, base_dir / "comfyui.log", cpu=not gpu)
    try:
        c = Comfy(port)
        c.wait_up(proc)
        wf = json.loads(wf_path.read_text())
        status, body = c.queue(convert(wf, c.get("/object_info")), wf)
        if status != 200:
            print(json.dumps(body, indent=2))
            return 1
        entry = c.wait(body["prompt_id"])
        print("status:", entry["status"]["status_str"])
        for f in output_files(entry, base_dir):
            print(f)
        return 0 if entry["status"]["status_str"] == "success" else 1
    finally:
        stop_comfy(proc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
