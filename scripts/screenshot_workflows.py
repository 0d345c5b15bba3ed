"""Screenshots from the newest ComfyUI frontend: example_workflows/<name>.jpg (the template browser's
thumbnails) and the README's docs/images/*.png.

    COMFYUI_DIR=.cache/comfyui/ComfyUI .venv/bin/python scripts/screenshot_workflows.py [--renderer classic|vue]

Needs what the browser tests need (scripts/setup_env.sh --full: ComfyUI 0.3.75, the newest frontend in
.cache/comfyui/frontend-newest, Debian's chromium). Every example workflow is opened, run once against the
tiny random test checkpoints (so the takes widget, the loader's info box and the stream player show a
result) and photographed fitted to the window; the README images are crops around one node. Not run in CI.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PACK = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(PACK / "scripts"), str(PACK / "tests" / "support")]
import comfy_client as client  # noqa: E402
from cdp import Page, close_tab, new_tab, page_ws_url, start_chromium  # noqa: E402

FOLDER = "qwen3-tts-fast"
THUMB = (480, 300)
README_CROPS = {"takes_widget": ("qwen3tts_custom_voice_takes", "Qwen3TTSFast_PickTake")}


def _finished(comfy, before: set, timeout: float = 300) -> dict:
    t_end = time.time() + timeout
    while time.time() < t_end:
        done = [v for k, v in comfy.get("/history").items()
                if k not in before and v.get("status", {}).get("completed") is not None]
        if done:
            return done[0]
        time.sleep(0.3)
    raise TimeoutError("the workflow did not finish")


async def _node_box(page, node_type: str | None = None, pad: int = 12) -> dict:
    """The on-screen box of one node, or of all nodes (node_type None), title bars and DOM widgets included,
    with `pad` pixels around it."""
    return json.loads(await page.eval(f"""(() => {{
        const c = window.app.canvas, s = c.ds.scale, t = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
        const r = c.canvas.getBoundingClientRect(), want = {json.dumps(node_type)};
        const boxes = window.app.graph._nodes.filter(n => !want || n.type === want).map(n => [
            (n.pos[0] + c.ds.offset[0]) * s + r.left, (n.pos[1] - t + c.ds.offset[1]) * s + r.top,
            (n.pos[0] + n.size[0] + c.ds.offset[0]) * s + r.left, (n.pos[1] + n.size[1] + c.ds.offset[1]) * s + r.top]);
        const x0 = Math.min(...boxes.map(b => b[0])) - {pad}, y0 = Math.min(...boxes.map(b => b[1])) - {pad};
        const x1 = Math.max(...boxes.map(b => b[2])) + {pad}, y1 = Math.max(...boxes.map(b => b[3])) + {pad};
        return JSON.stringify({{x: x0, y: y0, width: x1 - x0, height: y1 - y0, scale: 1}}); }})()"""))


async def _centre(page, node_type: str, zoom: float) -> None:
    await page.eval(f"""(() => {{ const c = window.app.canvas;
        const n = window.app.graph._nodes.find(n => n.type === {json.dumps(node_type)});
        const w = c.canvas.clientWidth, h = c.canvas.clientHeight;
        c.ds.scale = {zoom};
        c.ds.offset[0] = w / 2 / {zoom} - (n.pos[0] + n.size[0] / 2);
        c.ds.offset[1] = h / 2 / {zoom} - (n.pos[1] + n.size[1] / 2);
        c.setDirty(true, true); return true; }})()""")
    await asyncio.sleep(0.8)


async def shoot(stack: dict, renderer: str, out_thumbs: Path, out_images: Path) -> list[Path]:
    import aiohttp
    from PIL import Image

    comfy = stack["comfy"]
    # The renderer; no minimap over the graph; no first-run template browser or coachmarks over it either.
    for key, value in (("Comfy.VueNodes.Enabled", renderer == "vue"), ("Comfy.Minimap.Visible", False),
                       ("Comfy.TutorialCompleted", True), ("Comfy.OnboardingCoachmarks.Seen", True)):
        status = comfy.post(f"/api/settings/{key}", value)[0]
        if status != 200:
            raise RuntimeError(f"setting {key} failed with HTTP {status}")
    written = []
    tab = new_tab(stack["cdp_port"])
    try:
        async with aiohttp.ClientSession() as s, s.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            await page.send("Page.enable")
            await page.send("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1,
                            mobile=False)
            await page.send("Page.navigate", url=stack["url"])
            await page.wait_for("!!(window.app && window.app.graph && window.app.extensionManager)", 90)
            version = await page.eval("window.__COMFYUI_FRONTEND_VERSION__")
            await asyncio.sleep(2)
            if await page.eval("!!document.querySelector('[role=dialog]')"):
                for kind in ("keyDown", "keyUp"):
                    await page.send("Input.dispatchKeyEvent", type=kind, key="Escape", code="Escape",
                                    windowsVirtualKeyCode=27)
                await page.wait_for("!document.querySelector('[role=dialog]')", 10, "the dialog to close")
            for name in sorted(comfy.get("/api/workflow_templates")[FOLDER]):
                await page.eval(f"""fetch('/api/workflow_templates/{FOLDER}/{name}.json').then(r => r.json())
                    .then(wf => window.app.loadGraphData(wf, true, true, {json.dumps(name)})).then(() => true)""")
                before = set(comfy.get("/history"))
                await page.eval("window.app.queuePrompt(0, 1)")
                entry = await asyncio.to_thread(_finished, comfy, before)
                if entry["status"]["status_str"] != "success":
                    raise RuntimeError(f"{name} did not run: {entry['status']}")
                await asyncio.sleep(1.5)  # the frontend renders the results
                for image, (workflow, node_type) in README_CROPS.items():
                    if workflow == name:
                        await _centre(page, node_type, 1.25)
                        shot = await page.send("Page.captureScreenshot", format="png",
                                               clip=await _node_box(page, node_type))
                        path = out_images / f"{image}.png"
                        crop = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
                        crop.quantize(256).save(path, optimize=True)  # UI colours fit a palette: a third the size
                        written.append(path)
                await page.eval("window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
                await asyncio.sleep(0.8)
                shot = await page.send("Page.captureScreenshot", format="png")
                img = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
                img = img.crop(_thumb_box(await _node_box(page, pad=24), img.size)).resize(THUMB, Image.LANCZOS)
                path = out_thumbs / f"{name}.jpg"
                img.save(path, quality=60, optimize=True, progressive=True)  # a thumbnail: small beats sharp in a clone
                written.append(path)
    finally:
        close_tab(stack["cdp_port"], tab)
    print(f"frontend {version}, {renderer} renderer")
    return written


def _thumb_box(box: dict, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """`box` (all nodes) widened or heightened to the thumbnail's aspect ratio, kept inside the window."""
    ratio = THUMB[0] / THUMB[1]
    w, h = box["width"], box["height"]
    w, h = max(w, h * ratio), max(h, w / ratio)
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    x0 = min(max(0, cx - w / 2), max(0, size[0] - w))
    y0 = min(max(0, cy - h / 2), max(0, size[1] - h))
    return int(x0), int(y0), int(min(size[0], x0 + w)), int(min(size[1], y0 + h))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renderer", choices=["classic", "vue"], default="classic")
    ap.add_argument("--port", type=int, default=8197)
    args = ap.parse_args(argv)
    comfy_dir = Path(os.environ.get("COMFYUI_DIR", PACK / ".cache" / "comfyui" / "ComfyUI"))
    frontend = client.newest_frontend(comfy_dir)
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if frontend is None or chromium is None:
        print("needs the newest frontend (scripts/setup_frontend_newest.sh) and chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        (base / "custom_nodes").mkdir(parents=True)
        os.symlink(PACK, base / "custom_nodes" / FOLDER)
        client.install_test_checkpoints(base / "models")
        client.install_reference_audio(base / "input")
        proc = client.start_comfy(comfy_dir, base, args.port, Path(tmp) / "comfyui.log", frontend=frontend)
        cport = args.port + 1
        browser = start_chromium(chromium, cport, Path(tmp) / "profile", Path(tmp) / "chromium.log")
        try:
            client.Comfy(args.port).wait_up(proc)
            page_ws_url(cport)
            stack = {"url": f"http://127.0.0.1:{args.port}", "comfy": client.Comfy(args.port), "cdp_port": cport}
            for path in asyncio.run(shoot(stack, args.renderer, PACK / "example_workflows", PACK / "docs" / "images")):
                print("wrote", path.relative_to(PACK))
        finally:
            browser.terminate()
            browser.wait(timeout=20)
            client.stop_comfy(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
