"""The speech server as the serving benches see it: a fresh `python -m engine serve` process, and speech requests
timed chunk by chunk from an asyncio aiohttp client (the server's clients are network clients, so these are too).

Times are time.perf_counter() seconds of the client process. A streamed response is raw 16-bit mono PCM at
24 kHz: 48,000 bytes a second, 3,840 bytes a codec frame.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BYTES_PER_S = 48_000
FRAME_BYTES = 3_840
STARTED = re.compile(r" on http://(\S+):(\d+); API key")


class ServerProcess:
    """`python -m engine serve --model MODEL --port 0 *args` in a fresh process; `.url` once its startup line has
    named the bound port. `stop()` (or leaving the `with`) sends SIGTERM, as Ctrl-C would. Its stderr is kept
    (the last 400 lines, `.log()`), so a failure can show the server's side."""

    def __init__(self, model, args=(), env: dict | None = None, timeout: float = 900.0):
        cmd = [sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", "0", *map(str, args)]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        self.lines: collections.deque = collections.deque(maxlen=400)
        self.url = self.serving = None
        self.tracebacks = 0  # over the whole log, not only the lines kept
        found = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                self.tracebacks += line.startswith("Traceback")
                m = STARTED.search(line)
                if m and self.url is None:
                    self.url = f"http://{m.group(1)}:{m.group(2)}"
                    self.serving = line[:m.start()].strip()  # what runs: the model, device, graphs, kernels
                    found.set()
            found.set()  # the process ended

        threading.Thread(target=read, name="server-stderr", daemon=True).start()
        try:
            found.wait(timeout)
        except BaseException:  # stopped while loading (Ctrl-C, or the bench's SIGTERM): show how far it got
            print(self.log(40), file=sys.stderr, flush=True)
            self.stop()
            raise
        if self.url is None:
            self.stop()
            raise RuntimeError(f"the server did not start ({' '.join(cmd)}):\n" + self.log(40))
        self.start_s = time.perf_counter() - t0  # process start, imports, load and graph capture

    def loop_cpu_s(self) -> float | None:
        """CPU seconds the server's main thread (its asyncio event loop: HTTP, the chunks' conversion and writes)
        has used so far, from /proc (None where there is none)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def log(self, last: int = 400) -> str:
        return "\n".join(list(self.lines)[-last:])

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def session(keep_alive: bool = False):
    """A client session with no connection limit and no overall timeout (a long sentence under load takes long):
    a new connection for every request (as the nodes' remote client makes), or with `keep_alive` one connection
    used again (as the OpenAI clients keep theirs)."""
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=not keep_alive),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=600))


async def health(client, url: str) -> dict:
    async with client.get(f"{url}/health") as resp:
        return await resp.json()


async def wait_idle(client, url: str, timeout: float = 120.0) -> dict:
    """Poll /health until no request waits or runs and no row is in use; the last answer either way."""
    deadline = time.monotonic() + timeout
    while True:
        h = await health(client, url)
        if (h["queued"], h["running"], h["rows"]) == (0, 0, 0) or time.monotonic() > deadline:
            return h
        await asyncio.sleep(0.05)


async def speech(client, url: str, body, *, stop_after: int | None = None, give_up_s: float | None = None,
                 rec: dict | None = None, keep: bool = False) -> dict:
    """One POST /v1/audio/speech, timed. `body`: a dict sent as JSON, or bytes sent as they are.

    Returns {sent, status, first (first body byte), chunks: [[arrival, bytes]] (one per HTTP chunk, at its last
    byte), bytes, done (the body ended normally), error, json (an error's body), sha256, server_ms (the response's
    Server-Timing: {step: ms})}. `stop_after`: close the
    connection once that many body bytes came (a client that leaves mid-stream). `give_up_s`: close it if the
    headers have not come by then (a client that leaves while its request waits). `rec`: a dict to fill in place,
    so a caller that cancels the call keeps what had come by then. `keep`: also return the body, as `pcm`."""
    import hashlib
    import json

    import aiohttp

    from engine.serve.server_timing import parse_header

    rec = {} if rec is None else rec
    rec.update({"sent": time.perf_counter(), "status": None, "first": None, "chunks": [], "bytes": 0, "done": False,
                "error": None, "json": None, "sha256": None, "pcm": None, "server_ms": {}})
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    digest, pending, kept = hashlib.sha256(), 0, []
    try:
        post = client.post(f"{url}/v1/audio/speech", data=data, headers={"Content-Type": "application/json"})
        resp = await (asyncio.wait_for(post, give_up_s) if give_up_s is not None else post)
        try:
            rec["status"] = resp.status
            rec["server_ms"] = parse_header(resp.headers.get("Server-Timing"))
            if resp.status != 200:
                rec["json"] = await resp.json(content_type=None)
                rec["done"] = True
                return rec
            async for piece, end_of_chunk in resp.content.iter_chunks():
                now = time.perf_counter()
                if rec["first"] is None and piece:
                    rec["first"] = now
                digest.update(piece)
                if keep:
                    kept.append(piece)
                rec["bytes"] += len(piece)
                pending += len(piece)
                if end_of_chunk and pending:
                    rec["chunks"].append([now, pending])
                    pending = 0
                if stop_after is not None and rec["bytes"] >= stop_after:
                    resp.close()  # drops the connection: the server sees the client leave
                    rec["error"] = "left"
                    return rec
            if pending:
                rec["chunks"].append([time.perf_counter(), pending])
            rec["done"] = True
            rec["sha256"] = digest.hexdigest()
            if keep:
                rec["pcm"] = b"".join(kept)
        finally:
            resp.release()
    except asyncio.TimeoutError:
        rec["error"] = "left before the headers"
    except (aiohttp.ClientError, ConnectionError, ValueError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    return rec


def underruns(chunks) -> int:
    """Stalls of playback that starts when the first chunk arrives and plays each chunk's audio at real time: a
    chunk that arrives after the audio before it has finished playing is one underrun, and playback goes on
    from that chunk's arrival."""
    events, runs_out = 0, None
    for arrival, size in chunks:
        if runs_out is not None and arrival > runs_out:
            events += 1
        runs_out = max(runs_out or arrival, arrival) + size / BYTES_PER_S
    return events


def gaps_ms(chunks) -> list:
    """Milliseconds between consecutive chunk arrivals of one response."""
    return [1000 * (b[0] - a[0]) for a, b in itertools.pairwise(chunks)]
