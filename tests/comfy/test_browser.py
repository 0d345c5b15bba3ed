"""A real browser: headless Debian chromium loads the ComfyUI frontend with the pack, opens example
workflows from the template browser, queues them, and checks the takes widget and the streaming player.
Screenshots go to tests/artifacts/."""
from __future__ import annotations

import asyncio
import json
import os
import time
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


def _history_entry(comfy, before: set, timeout: float = 240) -> tuple[str, dict]:
    """The one prompt that entered /history after `before` was taken, once it finished."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        new = {k: v for k, v in comfy.get("/history").items() if k not in before}
        done = {k: v for k, v in new.items() if v.get("status", {}).get("completed") is not None}
        if done:
            assert len(new) == 1, f"expected one new prompt, got {list(new)}"
            return next(iter(done.items()))
        time.sleep(0.3)
    raise TimeoutError("the queued prompt did not finish")


def _audio_path(base: Path, item: dict) -> Path:
    return base / item.get("type", "output") / item.get("subfolder", "") / item["filename"]


def test_pick_loop_reruns_only_pick_take(stack, comfy_base, artifacts):
    """Run the takes workflow with the seed left on randomize, pick take 2 with 'use this take', queue again:
    the generator is not run again (ComfyUI serves it from its cache) and the saved output is take 2 of the
    first run, sample for sample. Also: every example workflow's Note is at most 360 px wide and covers no node."""
    import aiohttp
    from cdp import Page

    from _q3support import read_audio

    comfy = stack["comfy"]
    seed = 4343  # not used by any other test on this server, so the first run really generates

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(stack["ws"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.send("Runtime.enable")
                await page.send("Page.enable")
                await page.send("Page.navigate", url=stack["url"])
                await page.wait_for("!!(window.app && window.app.graph && window.app.extensionManager)", 90,
                                    "the ComfyUI frontend")
                notes = {}
                for name in sorted(comfy.get("/api/workflow_templates")[FOLDER]):
                    await page.eval(f"""fetch('/api/workflow_templates/{FOLDER}/{name}.json').then(r => r.json())
                        .then(wf => window.app.loadGraphData(wf, true, true, {json.dumps(name)})).then(() => true)""")
                    await asyncio.sleep(0.3)
                    notes[name] = json.loads(await page.eval("""JSON.stringify(window.app.graph._nodes.map(n => ({
                        type: n.type, x: n.pos[0], y: n.pos[1] - (window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30),
                        w: n.size[0], h: Math.max(n.size[1], n.computeSize?.()[1] ?? 0)
                            + (window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30)})))"""))

                await _open_template(page, "qwen3tts_custom_voice_takes", "Qwen3TTSFast_PickTake")
                gen = "window.app.graph._nodes.find(n => n.type === 'Qwen3TTSFast_CustomVoice')"
                widget = f"(name) => {gen}.widgets.find(w => w.name === name)"
                shipped = await page.eval(f"({widget})('control_after_generate').value")
                # A user who set the seed to randomize: the frontend changes it right after queueing.
                await page.eval(f"""(() => {{ const w = {widget};
                    w('control_after_generate').value = 'randomize'; w('seed').value = {seed}; return true; }})()""")
                before = set(comfy.get("/history"))
                await page.eval("window.app.queuePrompt(0, 1)")
                first_id, first = await asyncio.to_thread(_history_entry, comfy, before)
                await page.wait_for(f"""[...document.querySelectorAll('.qwen3tts-take-origin')]
                    .filter(e => e.textContent.startsWith('seed {seed} ')).length === 4""", 60, "the new takes")
                seed_after_queue = await page.eval(f"({widget})('seed').value")

                await page.eval("document.querySelectorAll('.qwen3tts-use-take')[2].click()")
                picked = json.loads(await page.eval(f"""JSON.stringify({{
                    index: window.app.graph._nodes.find(n => n.type === 'Qwen3TTSFast_PickTake')
                        .widgets.find(w => w.name === 'index').value,
                    seed: ({widget})('seed').value, control: ({widget})('control_after_generate').value,
                    note: document.querySelector('.qwen3tts-take-note').textContent,
                    origin: document.querySelectorAll('.qwen3tts-take-origin')[2].textContent}})"""))
                await asyncio.sleep(0.3)
                await page.screenshot(artifacts / "pick_loop_pinned.png")
                before = set(comfy.get("/history"))
                await page.eval("window.app.queuePrompt(0, 1)")
                second_id, second = await asyncio.to_thread(_history_entry, comfy, before)
                return shipped, seed_after_queue, picked, notes, first, second, page.console

    shipped, seed_after_queue, picked, notes, first, second, console = asyncio.run(go())
    for name, nodes in notes.items():
        (note,) = [n for n in nodes if n["type"] == "Note"]
        assert note["w"] <= 360, name
        for n in nodes:
            if n is not note:
                apart = (note["x"] + note["w"] <= n["x"] or n["x"] + n["w"] <= note["x"] or
                         note["y"] + note["h"] <= n["y"] or n["y"] + n["h"] <= note["y"])
                assert apart, f"{name}: the Note covers {n['type']}"
    assert shipped == "fixed"
    assert seed_after_queue != seed, "the frontend should have randomized the seed after queueing"
    assert picked["index"] == 2 and picked["control"] == "fixed" and picked["seed"] == seed
    assert "Pinned" in picked["note"] and "'randomize' → 'fixed'" in picked["note"] and str(seed) in picked["note"]
    assert picked["origin"] == f"seed {seed} · take 2"
    assert first["status"]["status_str"] == "success" and second["status"]["status_str"] == "success"
    cached = next(m[1]["nodes"] for m in second["status"]["messages"] if m[0] == "execution_cached")
    assert {"1", "2"} <= set(cached), f"the generator ran again (cached: {cached})"
    assert "3" not in cached  # PickTake did re-run, with index 2
    take2 = _audio_path(comfy_base, first["outputs"]["5"]["audio"][2])  # SaveAudio of all four takes
    out = _audio_path(comfy_base, second["outputs"]["4"]["audio"][0])  # SaveAudio of the picked take
    x, y = read_audio(out)[0], read_audio(take2)[0]
    assert x.size > 0 and x.tobytes() == y.tobytes()
    assert x.tobytes() != read_audio(_audio_path(comfy_base, first["outputs"]["5"]["audio"][1]))[0].tobytes()
    assert not [c for c in console if c.startswith("EXCEPTION") and "qwen3tts" in c.lower()]
