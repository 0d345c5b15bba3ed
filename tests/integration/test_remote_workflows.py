"""The example workflows with LoadQwen3TTS pointed at speech servers (`python -m engine serve`, one per tiny
checkpoint, on the CPU; one wants an API key) give the audio the same workflows give with the checkpoints loaded
in ComfyUI; a server that cannot be reached, or a wrong key, is a node error that says what to do; cancelling in
ComfyUI frees the server."""
from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support._q3support import (
    EXAMPLE_WORKFLOWS,
    PACK,
    free_port,
    load_script,
    read_audio,
    running_comfy,
)

pytestmark = [pytest.mark.engine]
client = load_script("comfy_client")
ui_to_api = load_script("ui_to_api")
LOADER = "Qwen3TTSFast_LoadQwen3TTS"
# The server's float audio travels exactly; the codec decodes the server's separate requests apart and ComfyUI's
# batch together, which moves a sample by float rounding: at most one step of the files' 16-bit samples.
LSB = 1 / 32768


KEYS = {"Qwen3-TTS-12Hz-0.6B-CustomVoice": "custom-voice-key"}  # one server wants a key: the loader sends it


def _start_server(model_dir: Path, log: Path, key: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(PACK)}
    env.pop("QWEN3TTS_API_KEY", None)
    if key:
        env["QWEN3TTS_API_KEY"] = key
    with open(log, "w") as out:  # the child keeps its own copy of the file
        proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model_dir), "--device",
                                 "cpu", "--port", str(port), "--max-takes", "4"], cwd=PACK, stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    host, port = url.rsplit("/", 1)[-1].split(":")
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, log.read_text()
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the server at {url} did not come up: {log.read_text()}")


@pytest.fixture(scope="module")
def servers(comfy_base):
    """{checkpoint folder name: server URL}: a server for each tiny checkpoint the example workflows load."""
    procs, urls = [], {}
    try:
        for name in client.CHECKPOINTS:
            log = comfy_base / f"serve-{name}.log"
            proc, url = _start_server(comfy_base / "models" / "qwen3_tts" / name, log, KEYS.get(name))
            procs.append((proc, url, log))
            urls[name] = url
        for proc, url, log in procs:
            _wait_healthy(proc, url, log)
        yield urls
    finally:
        for proc, _, _ in procs:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def comfy(comfy_base):
    with running_comfy(comfy_base, "comfyui-remote.log", object_info=True) as c:
        yield c


def _prompt(c, name: str, servers: dict | None = None) -> dict:
    wf = json.loads((PACK / "example_workflows" / f"{name}.json").read_text())
    prompt = ui_to_api.convert(wf, c.object_info)
    for node in prompt.values():
        if node["class_type"] == LOADER and servers is not None:
            node["inputs"]["server"] = servers[node["inputs"]["checkpoint"]]
            node["inputs"]["api_key"] = KEYS.get(node["inputs"]["checkpoint"], "")
    return prompt


def _run(c, prompt) -> dict:
    status, body = c.queue(prompt)
    assert status == 200, body
    entry = c.wait(body["prompt_id"])
    assert entry["status"]["status_str"] == "success", entry["status"]
    return entry


def _audio(c, entry) -> dict:
    """{file prefix: [samples of each file]} of a run's saved audio."""
    out = {}
    for f in client.output_files(entry, c.base):
        out.setdefault(f.name.rsplit("_", 2)[0], []).append(read_audio(f)[0])
    return out


@pytest.mark.parametrize("name", EXAMPLE_WORKFLOWS)
def test_an_example_workflow_on_a_server_equals_it_run_here(comfy, servers, name):
    local = _audio(comfy, _run(comfy, _prompt(comfy, name)))
    entry = _run(comfy, _prompt(comfy, name, servers))
    remote = _audio(comfy, entry)
    assert remote.keys() == local.keys() and local
    for prefix, files in local.items():
        assert len(remote[prefix]) == len(files)
        for got, want in zip(remote[prefix], files):
            assert got.shape == want.shape and np.abs(want).max() > 0, prefix
            assert np.abs(got - want).max() <= LSB, (prefix, np.abs(got - want).max())
    info = next(o["text"][0] for o in entry["outputs"].values() if "text" in o and " on http://" in o["text"][0])
    assert "server: device cpu" in info


def test_an_unreachable_server_is_a_node_error_naming_it(comfy):
    port = free_port()  # nothing listens there
    prompt = _prompt(comfy, "qwen3tts_voice_design")
    loader = next(k for k, n in prompt.items() if n["class_type"] == LOADER)
    prompt[loader]["inputs"]["server"] = f"http://127.0.0.1:{port}"
    status, body = comfy.queue(prompt)
    assert status == 200, body
    entry = comfy.wait(body["prompt_id"])
    err = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert str(err["node_id"]) == loader
    assert re.search(rf"^LoadQwen3TTS: cannot reach the speech server at http://127\.0\.0\.1:{port} .*"
                     r"python -m engine serve", err["exception_message"]), err["exception_message"]
    prompt[loader]["inputs"]["server"] = "ftp://nowhere"
    status, body = comfy.queue(prompt)
    assert status == 400 and "http://HOST:PORT" in json.dumps(body["node_errors"][loader])


def test_a_wrong_api_key_is_a_node_error_naming_the_input(comfy, servers):
    prompt = _prompt(comfy, "qwen3tts_custom_voice_takes", servers)
    loader = next(k for k, n in prompt.items() if n["class_type"] == LOADER)
    prompt[loader]["inputs"]["api_key"] = "not-the-key"
    status, body = comfy.queue(prompt)
    assert status == 200, body
    entry = comfy.wait(body["prompt_id"])
    err = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert str(err["node_id"]) == loader and err["exception_message"].startswith("LoadQwen3TTS: ")
    assert "refused the API key" in err["exception_message"] and "api_key" in err["exception_message"]


def _health(url: str) -> dict:
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/health")
    return json.loads(conn.getresponse().read())


def test_cancel_in_comfyui_stops_the_servers_requests(comfy, servers):
    """A 4-take run of 2000 frames a take is interrupted once the server works on it: ComfyUI reports the
    interrupt, the server counts the requests it was serving as cancelled and is idle again, and the next run
    succeeds."""
    url = servers["Qwen3-TTS-12Hz-0.6B-CustomVoice"]
    before = _health(url)["requests"]["cancelled"]
    prompt = _prompt(comfy, "qwen3tts_custom_voice_takes", servers)
    generator = next(k for k, n in prompt.items() if n["class_type"] == "Qwen3TTSFast_CustomVoice")
    prompt[generator]["inputs"].update(max_new_tokens=2000, seed=4242)
    status, body = comfy.queue(prompt)
    assert status == 200, body
    end = time.time() + 60
    while not _health(url)["busy"] and time.time() < end:
        time.sleep(0.1)
    assert comfy.post("/interrupt", {})[0] == 200
    entry = comfy.wait(body["prompt_id"], timeout=60)
    assert "execution_interrupted" in [m[0] for m in entry["status"]["messages"]], entry["status"]
    end = time.time() + 30
    while (_health(url)["busy"] or _health(url)["queued"]) and time.time() < end:
        time.sleep(0.2)
    health = _health(url)
    assert not health["busy"] and health["queued"] == 0 and health["requests"]["cancelled"] > before
    _run(comfy, _prompt(comfy, "qwen3tts_custom_voice_takes", servers))
