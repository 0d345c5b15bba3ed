"""A real browser: headless Debian chromium loads the ComfyUI frontend with the pack, opens example
workflows from the template browser, queues them, and checks the takes widget and the streaming player.
Screenshots go to tests/artifacts/."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from _q3support import COMFYUI_DIR, chromium_path, free_port, load_script

pytestmark = [pytest.mark.engine, pytest.mark.browser]
client = load_script("comfy_client")
FOLDER = "qwen3-tts-fast"  # the pack's folder name under custom_nodes/ = template category


@pytest.fixture(scope="module")
def stack(comfy_base, tmp_path_factory):
    chromium = chromium_path()
    if not chromium:
        if os.environ.get("QWEN3TTS_STRICT_TESTS") == "1":
            pytest.fail("QWEN3TTS_STRICT_TESTS=1 but no chromium: apt-get install -y chromium (or set CHROMIUM=/path)")
        pytest.skip("no chromium: apt-get install -y chromium (or set CHROMIUM=/path)")
    from cdp import page_ws_url, start_chromium

    port = free_port()
    proc = client.start_comfy(Path(COMFYUI_DIR), comfy_base, port, comfy_base / "comfyui-browser.log")
    cport = free_port()
    tmp = tmp_path_factory.mktemp("chromium")
    browser = start_chromium(chromium, cport, tmp / "profile", tmp / "chromium.log")
    try:
        client.Comfy(port).wait_up(proc)
        yield {"url": f"http://127.0.0.1:{port}", "ws": page_ws_url(cport), "comfy": client.Comfy(port)}
    finally:
        browser.terminate()
        browser.wait(timeout=20)
        client.stop_comfy(proc)


async def _open_template(page, name: str, node_type: str) -> str:
    """Open `name` through the template browser UI; returns how it was opened."""
    await page.eval("window.app.graph.clear(); true")
    await page.eval("window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    try:
        await page.wait_for(f"""(() => {{
            const el = [...document.querySelectorAll('.p-dialog *')].find(e => e.children.length === 0 &&
                e.textContent.trim() === {json.dumps(FOLDER)});
            if (el) el.click();
            return !!el; }})()""", 20, "our category in the template browser")
        await page.wait_for(f"""(() => {{
            const el = [...document.querySelectorAll('.p-dialog *')].find(e => e.children.length === 0 &&
                e.textContent.trim().includes({json.dumps(name)}));
            if (el) el.click();
            return !!el; }})()""", 20, "our template card")
        await page.wait_for(f"window.app.graph._nodes.some(n => n.type === {json.dumps(node_type)})", 20)
        return "template browser"
    except TimeoutError:
        # Same code path as the template browser's own load, minus the clicks.
        await page.eval("document.querySelectorAll('.p-dialog-close-button').forEach(b => b.click())")
        await page.eval(f"""fetch('/api/workflow_templates/{FOLDER}/{name}.json').then(r => r.json())
            .then(wf => window.app.loadGraphData(wf, true, true, {json.dumps(name)})).then(() => true)""")
        await page.wait_for(f"window.app.graph._nodes.some(n => n.type === {json.dumps(node_type)})", 20)
        return "loadGraphData (template browser click path failed)"


def test_templates_are_listed(stack):
    listed = stack["comfy"].get("/api/workflow_templates")
    assert FOLDER in listed
    assert {"qwen3tts_custom_voice_takes", "qwen3tts_streaming"} <= set(listed[FOLDER])


def test_takes_widget_and_streaming_player(stack, artifacts):
    import aiohttp
    from cdp import Page

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(stack["ws"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.send("Runtime.enable")
                await page.send("Page.enable")
                await page.send("Page.navigate", url=stack["url"])
                await page.wait_for("!!(window.app && window.app.graph && window.app.extensionManager)", 90,
                                    "the ComfyUI frontend")
                await page.wait_for("document.querySelector('canvas') !== null", 30)

                print("streaming underruns are expected where RTF < 1 (slower than real time)")
                how = await _open_template(page, "qwen3tts_custom_voice_takes", "Qwen3TTSFast_PickTake")
                await page.eval("window.app.queuePrompt(0, 1)")
                n = await page.wait_for("document.querySelectorAll('.qwen3tts-take audio').length", 240,
                                        "the takes widget")
                await asyncio.sleep(1)
                await page.screenshot(artifacts / "takes_widget.png")
                assert n == 4, f"takes widget shows {n} players"
                await page.eval("document.querySelectorAll('.qwen3tts-use-take')[2].click()")
                index = await page.eval(
                    "window.app.graph._nodes.find(n => n.type === 'Qwen3TTSFast_PickTake')"
                    ".widgets.find(w => w.name === 'index').value")
                assert index == 2

                how2 = await _open_template(page, "qwen3tts_streaming", "Qwen3TTSFast_StreamChunks")
                await page.eval("window.app.queuePrompt(0, 1)")
                await page.wait_for("window.__qwen3ttsStream && Object.values(window.__qwen3ttsStream)"
                                    ".some(s => s.done)", 240, "the end of the stream")
                st = await page.eval("JSON.stringify(Object.values(window.__qwen3ttsStream).find(s => s.done))")
                await asyncio.sleep(0.5)
                await page.screenshot(artifacts / "streaming_player.png")
                text = await page.eval("document.querySelector('.qwen3tts-stream-status').textContent")
                return how, how2, json.loads(st), text, page.console

    how, how2, st, text, console = asyncio.run(go())
    print("opened via:", how, "/", how2)
    assert st["chunks"] >= 3 and st["seqs"] == list(range(st["chunks"]))
    # Back to back whenever a chunk arrives in time; on this CPU (RTF < 1) a late chunk is an underrun
    # that the player counts as a gap and restarts after. Never overlapping.
    pairs = list(zip(st["scheduled"], st["scheduled"][1:]))
    back_to_back = sum(abs(t0 + d0 - t1) < 1e-6 for (t0, d0), (t1, _) in pairs)
    assert all(t1 >= t0 + d0 - 1e-6 for (t0, d0), (t1, _) in pairs)
    assert back_to_back + st["gaps"] == len(pairs)
    assert st["ttfaClient"] is not None and st["rtf"] > 0
    assert "TTFA" in text and "RTF" in text
    assert not [c for c in console if c.startswith("EXCEPTION") and "qwen3tts" in c.lower()]
