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
            elif data.get("method") == "Runtime.consoleAPICalled":
                args = data["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif data.get("method") == "Runtime.exceptionThrown":
                self.console.append("EXCEPTION " + json.dumps(data["params"]["exceptionDetails"])[:500])

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
