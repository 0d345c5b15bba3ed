"""An engine HTTP server (engine/serve/) on a free localhost port, its event loop in a thread of its own, and a
plain stdlib client for it: tests talk to it over real sockets, as any client would."""
from __future__ import annotations

import asyncio
import http.client
import io
import json
import threading
import wave
from pathlib import Path

import numpy as np


def wav_samples(data: bytes) -> np.ndarray:
    """The 16-bit samples of a mono 24 kHz WAV answer (int16; checked to be such a file)."""
    from engine.config import SAMPLE_RATE

    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2")


class ServerThread:
    def __init__(self, engine=None, *, api_key: str | None = None, voices_dir: Path | None = None, max_takes: int = 4,
                 max_queue: int = 16, max_rows: int | None = None, chunk_frames: int = 2, first_chunk_frames: int = 0, max_body: int = 32 << 20,
                 backend=None, model=None):
        """Serve `engine` through the local Backend, or a given `backend` and `model` (ServedModel)."""
        from engine.serve.app import Settings
        from engine.serve.backend import Backend
        from engine.serve.served_model import ServedModel

        self.engine = engine
        self.api_key = api_key
        self.backend = backend if backend is not None else Backend(engine, max_queue=max_queue, max_rows=max_rows)
        self.model = model if model is not None else ServedModel.of(engine, max_takes, voices_dir)
        self.settings = Settings(api_key=api_key, chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames,
                                 max_body=max_body)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the test server did not start")
        if self.error is not None:
            raise self.error

    def _serve(self):
        from engine.serve.main import start_server

        asyncio.set_event_loop(self.loop)
        self.error = None
        try:
            self.runner, (self.host, self.port) = self.loop.run_until_complete(
                start_server(self.backend, self.model, self.settings, "127.0.0.1", 0))
        except Exception as exc:  # noqa: BLE001  any failure to start is raised by the constructor
            self.error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.backend.close()

    def request(self, method: str, path: str, body=None, headers: dict | None = None, key: str | None = "default",
                timeout: float = 120):
        """(status, headers, body bytes); `body` a dict is sent as JSON, bytes as they are; the server's API key is
        sent unless `key` says otherwise (None: no header)."""
        headers = dict(headers or {})
        key = self.api_key if key == "default" else key
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def speech(self, **fields):
        return self.request("POST", "/v1/audio/speech", fields)

    def json(self, method: str, path: str, body=None, **kwargs) -> tuple[int, dict]:
        status, _, data = self.request(method, path, body, **kwargs)
        return status, json.loads(data)
