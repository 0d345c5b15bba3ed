"""Minimal Chrome DevTools Protocol client (aiohttp only) driving a headless Debian chromium."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.request
from pathlib import Path


def start_chromium(path: str, port: int, profile: Path, log: Path) -> subprocess.Popen:
    args = [path, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--remote-debugging-port={port}", "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={profile}", "--autoplay-policy=no-user-gesture-required",
            "--window-size=1680,1050", "--no-first-run", "--mute-audio", "about:blank"]
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def page_ws_url(port: int, timeout: float = 30) -> str:
    t_end = time.time() + timeout
    while time.time() < t_end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                pages = [p for p in json.loads(r.read()) if p.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError("chromium did not expose a page over CDP")


def _frames_urls(stack: dict | None) -> list[str]:
    return [f.get("url", "") for f in (stack or {}).get("callFrames", [])]


def console_entry(method: str, params: dict) -> dict | None:
    """One browser console event (Runtime.consoleAPICalled / Runtime.exceptionThrown / Log.entryAdded) as
    {source, level, text, urls}: urls are the script addresses of the message and its stack."""
    if method == "Runtime.consoleAPICalled":
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
        return {"source": "console", "level": params.get("type", "log"), "text": text,
                "urls": _frames_urls(params.get("stackTrace"))}
    if method == "Runtime.exceptionThrown":
        d = params["exceptionDetails"]
        text = d.get("exception", {}).get("description") or d.get("text", "")
        return {"source": "exception", "level": "error", "text": text,
                "urls": [d.get("url", ""), *_frames_urls(d.get("stackTrace"))]}
    if method == "Log.entryAdded":
        e = params["entry"]
        return {"source": "log/" + e.get("source", ""), "level": e.get("level", "info"), "text": e.get("text", ""),
                "urls": [e.get("url", ""), *_frames_urls(e.get("stackTrace"))]}
    return None


def from_pack(entry: dict, folder: str, markers: tuple[str, ...]) -> bool:
    """True when a console entry comes from the pack: one of its web/ files is on the stack (or is the URL),
    or the text names the pack (its node ids, events and CSS classes all carry one of `markers`)."""
    if any(f"/extensions/{folder}/" in u for u in entry["urls"]):
        return True
    text = entry["text"].lower()
    return any(m.lower() in text for m in markers)


def new_tab(port: int) -> dict:
    """Open a fresh tab (a page of its own: no state, no beforeunload prompt of a previous test)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def close_tab(port: int, tab: dict) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/close/{tab['id']}", timeout=10):
        pass


class Page:
    def __init__(self, ws):
        self.ws, self.n, self.console = ws, 0, []
        self.pending: dict[int, asyncio.Future] = {}
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self):
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            elif "method" in data:
                entry = console_entry(data["method"], data.get("params", {}))
                if entry is not None:
                    self.console.append(entry)

    def errors(self) -> list[dict]:
        return [e for e in self.console if e["level"] in ("error", "assert")]

    async def send(self, method: str, **params):
        self.n += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.n] = fut
        await self.ws.send_str(json.dumps({"id": self.n, "method": method, "params": params}))
        res = await asyncio.wait_for(fut, 60)
        if "error" in res:
            raise RuntimeError(f"{method}: {res['error']}")
        return res["result"]

    async def eval(self, expr: str):
        res = await self.send("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in res:
            detail = res["exceptionDetails"].get("exception", {}).get("description")
            raise RuntimeError(f"JS error in {expr[:80]}: {detail}")
        return res["result"].get("value")

    async def wait_for(self, expr: str, timeout: float = 60, what: str = ""):
        t_end = time.time() + timeout
        last = None
        while time.time() < t_end:
            try:
                last = await self.eval(expr)
                if last:
                    return last
            except RuntimeError as exc:
                last = str(exc)
            await asyncio.sleep(0.25)
        raise TimeoutError(f"timed out waiting for {what or expr} (last value: {last})")

    async def screenshot(self, path: Path):
        res = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(res["data"]))
