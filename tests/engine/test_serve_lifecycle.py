"""`python -m engine serve` under the ways requests end: a client that leaves mid-stream or while waiting, two
clients at once, a full queue, a failure inside the engine; and the command itself, its options and its imports."""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.serve_thread import ServerThread, wav_samples

ROOT = Path(__file__).resolve().parents[2]
FRAME_BYTES = 1920 * 2
LONG = {"input": "A request long enough to be cut off.", "voice": "ryan", "max_new_tokens": 4000}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    from engine import Engine

    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_takes=2)


@pytest.fixture
def server(engine):
    """A fresh server per test (its counts start at zero): one row, and room for one waiting request."""
    s = ServerThread(engine, max_queue=1, max_rows=1)
    yield s
    s.stop()


def _open(server, fields: dict, body_bytes: int = 1) -> socket.socket:
    """Send a speech request on a raw socket and wait for the response's headers and `body_bytes` of its body
    (0: wait for nothing)."""
    sock = socket.create_connection((server.host, server.port), timeout=60)
    body = json.dumps(fields).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    data = b""
    while body_bytes and (b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < body_bytes):
        more = sock.recv(65536)
        assert more, data
        data += more
    if body_bytes:
        assert data.startswith(b"HTTP/1.1 200"), data[:300]
    return sock


def _health(server) -> dict:
    return server.json("GET", "/health")[1]


def _wait(server, what, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = _health(server)
        if what(health):
            return health
        time.sleep(0.05)
    raise AssertionError(f"timed out; /health says {_health(server)}")


def test_a_client_that_leaves_mid_stream_frees_the_engine(server):
    sock = _open(server, {**LONG, "stream": True}, body_bytes=FRAME_BYTES)
    assert _health(server)["busy"] is True
    sock.close()
    health = _wait(server, lambda h: not h["busy"])
    assert health["requests"] == {"completed": 0, "cancelled": 1, "failed": 0}  # stopped, not run to its end
    status, _, data = server.speech(input="Next one.", voice="ryan", max_new_tokens=3)
    assert status == 200 and len(data) == 44 + 3 * FRAME_BYTES


def test_a_client_that_leaves_while_waiting_for_a_whole_response_frees_the_engine(server):
    sock = _open(server, LONG, body_bytes=0)
    _wait(server, lambda h: h["busy"])
    sock.close()
    health = _wait(server, lambda h: not h["busy"])
    assert health["requests"]["cancelled"] == 1 and health["requests"]["completed"] == 0
    assert server.speech(input="Next one.", voice="ryan", max_new_tokens=3)[0] == 200


def _takes_pcm(fields: dict, body: bytes) -> list:
    """Each take's 16-bit samples of a response (PCM or a stream: the body; json: each take's WAV)."""
    if fields.get("response_format") != "json":
        return [np.frombuffer(body, "<i2").astype(int)]
    return [wav_samples(base64.b64decode(take["audio"])).astype(int) for take in json.loads(body)["takes"]]


def _as_if_alone(server, fields: dict, body: bytes) -> None:
    """The response under load equals the same request served alone: the same codes, so the same samples to
    within one 16-bit step (the codec decodes the rows held together as one batch, alone as one row)."""
    status, _, alone = server.speech(**fields)
    assert status == 200
    got, want = _takes_pcm(fields, body), _takes_pcm(fields, alone)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert all(np.abs(g - w).max() <= 1 for g, w in zip(got, want)), f"{fields} under load differs from alone"


@pytest.fixture
def roomy_server(engine):
    """Two requests may arrive before the worker takes the first: room for both to wait."""
    s = ServerThread(engine, max_queue=4)
    yield s
    s.stop()


def test_two_clients_at_once_both_get_their_own_audio(roomy_server):
    server = roomy_server
    a = {"input": "First client.", "voice": "ryan", "max_new_tokens": 8, "seed": 1, "stream": True}
    b = {"input": "Second client, another voice.", "voice": "vivian", "max_new_tokens": 6, "seed": 2,
         "response_format": "pcm"}
    got = {}
    threads = [threading.Thread(target=lambda k, f: got.__setitem__(k, server.speech(**f)), args=(k, f))
               for k, f in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got["a"][0] == got["b"][0] == 200
    assert len(got["a"][2]) == 8 * FRAME_BYTES and len(got["b"][2]) == 6 * FRAME_BYTES
    _as_if_alone(server, a, got["a"][2])
    _as_if_alone(server, b, got["b"][2])


def test_clients_at_once_share_the_decode_loop_and_each_gets_its_own_audio(roomy_server):
    """Four requests of mixed voices, seeds, sampling and takes, sent together: they decode in the one loop
    (the engine's two rows are seen busy together), and each response equals the same request served alone
    (to one 16-bit step: _as_if_alone)."""
    server = roomy_server
    asks = [{"input": "First client, long enough to overlap.", "voice": "ryan", "max_new_tokens": 40, "seed": 1,
             "stream": True},
            {"input": "Second client, another voice.", "voice": "vivian", "max_new_tokens": 30, "seed": 2,
             "temperature": 0.7, "response_format": "pcm"},
            {"input": "Third, two takes.", "voice": "ryan", "max_new_tokens": 12, "seed": 5, "takes": 2,
             "response_format": "json"},
            {"input": "Fourth, greedy.", "voice": "vivian", "max_new_tokens": 20, "do_sample": False,
             "response_format": "pcm"}]
    got, peak = {}, [0]
    threads = [threading.Thread(target=lambda i, f: got.__setitem__(i, server.speech(**f)), args=(i, f))
               for i, f in enumerate(asks)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak[0] = max(peak[0], _health(server)["rows"])
        time.sleep(0.01)
    assert peak[0] == 2
    for i, fields in enumerate(asks):
        assert got[i][0] == 200, got[i][2][:300]
        _as_if_alone(server, fields, got[i][2])
    health = _health(server)
    assert (health["rows"], health["running"], health["queued"]) == (0, 0, 0)


def test_past_the_queue_a_request_gets_503_and_the_others_finish(server):
    running = _open(server, {**LONG, "stream": True}, body_bytes=FRAME_BYTES)
    waiting = {}
    t = threading.Thread(target=lambda: waiting.setdefault("r", server.speech(input="Queued.", voice="ryan",
                                                                              max_new_tokens=3)))
    t.start()
    _wait(server, lambda h: h["queued"] == 1)
    status, headers, data = server.speech(input="One too many.", voice="ryan", max_new_tokens=3)
    assert status == 503 and headers["retry-after"] == "1"
    assert json.loads(data)["error"]["type"] == "server_busy" and "--max-queue" in json.loads(data)["error"]["message"]
    running.close()
    t.join(120)
    assert waiting["r"][0] == 200 and len(waiting["r"][2]) == 44 + 3 * FRAME_BYTES


def _fail_frames_after(monkeypatch, runner, good: int) -> None:
    """The decode loop's frame `good + 1` and every later one fail, as a device fault would."""
    real, calls = runner.next_frame, [0]

    def next_frame(host):
        calls[0] += 1
        if calls[0] > good:
            raise RuntimeError("simulated fault")
        return real(host)

    monkeypatch.setattr(runner, "next_frame", next_frame)


def test_an_unexpected_engine_failure_is_a_500_and_the_server_goes_on(server, monkeypatch):
    _fail_frames_after(monkeypatch, server.engine.runner, 0)
    status, body = server.json("POST", "/v1/audio/speech", {"input": "Hi.", "voice": "ryan", "max_new_tokens": 3})
    assert status == 500 and body["error"]["type"] == "server_error" and "simulated fault" in body["error"]["message"]
    monkeypatch.undo()
    assert server.speech(input="Hi.", voice="ryan", max_new_tokens=3)[0] == 200
    assert _health(server)["requests"] == {"completed": 1, "cancelled": 0, "failed": 1}


def test_a_failure_after_the_first_audio_cuts_the_stream_short(server, monkeypatch):
    """The client has its 200 already, so the server breaks the chunked body: the client sees an incomplete
    response, never a short one that looks complete."""
    _fail_frames_after(monkeypatch, server.engine.runner, 4)  # the first chunk: 4 frames
    with pytest.raises((http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError)):
        server.speech(input="Hi.", voice="ryan", max_new_tokens=6, stream=True)
    monkeypatch.undo()
    assert server.speech(input="Hi.", voice="ryan", max_new_tokens=3, stream=True)[0] == 200


def _serve(*args, env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "engine", "serve", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", ""), **(env or {})}, **kwargs)


def test_the_serve_command_serves_and_stops_on_sigterm(tiny_checkpoints, tmp_path):
    proc = _serve("--model", str(tiny_checkpoints["custom_voice"]), "--device", "cpu", "--dtype", "fp32", "--port",
                  "0", "--voices", str(tmp_path), env={"QWEN3TTS_API_KEY": "from-env"})
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "serving" in line:
                break
        found = re.search(r"http://127\.0\.0\.1:(\d+); API key required", lines[-1] if lines else "")
        assert found, "".join(lines)
        conn = http.client.HTTPConnection("127.0.0.1", int(found.group(1)), timeout=60)
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        assert resp.status == 401 and json.loads(resp.read())["error"]["type"] == "authentication_error"
        conn.request("POST", "/v1/audio/speech", json.dumps({"input": "From the command.", "voice": "aiden",
                                                             "max_new_tokens": 3}),
                     {"Authorization": "Bearer from-env", "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and len(resp.read()) == 44 + 3 * FRAME_BYTES
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.mark.parametrize(("args", "named"), [
    (["--voices", "/no/such/folder"], "--voices"), (["--port", "70000"], "--port"), (["--api-key", " "], "--api-key"),
    (["--max-takes", "0"], "--max-takes"), (["--chunk-frames", "4", "--first-chunk-frames", "5"], "--first-chunk-frames"),
])
def test_a_bad_serve_option_is_named_before_the_load(tiny_checkpoints, args, named):
    proc = _serve("--model", str(tiny_checkpoints["custom_voice"]), "--device", "cpu", *args)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.startswith("error: ") and named in err and "serving" not in err


def test_serve_needs_a_model_and_a_missing_folder_is_named(tmp_path):
    proc = _serve()
    assert proc.communicate(timeout=60)[1].count("--model") and proc.returncode == 2
    proc = _serve("--model", str(tmp_path / "missing"))
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 2 and "--model" in err and "not a folder" in err


def test_aiohttp_loads_only_when_serving():
    code = ("import sys, engine.cli as c; c._parser().parse_args(['serve', '--model', 'x']); "
            "import engine.serve.speech_request, engine.serve.backend; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'soundfile')))")
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
