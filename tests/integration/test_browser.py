"""A real browser: headless Debian chromium loads the ComfyUI frontend with the pack, opens example
workflows from the template browser, queues them, and checks the takes widget, "use this take", the
loader's info box and the streaming player.

It runs in a matrix (docs/COMPATIBILITY.md): ComfyUI 0.3.75 with its bundled frontend (classic canvas), and
with the newest frontend the package index serves (scripts/setup_frontend_newest.sh) on the classic canvas
and on the Vue node renderer ("Nodes 2.0", setting Comfy.VueNodes.Enabled). Browser console errors that come
from the pack fail the test. Screenshots go to tests/artifacts/<frontend>-<renderer>-*.png."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from tests.support._q3support import COMFYUI_DIR, chromium_path, free_port, load_script

pytestmark = [pytest.mark.engine, pytest.mark.browser]
client = load_script("comfy_client")
FOLDER = "qwen3-tts-fast"  # the pack's folder name under custom_nodes/ = template category
PACK_MARKERS = ("qwen3tts", "qwen3-tts")  # in every node id, event name, CSS class and log line of the pack
VUE_SETTING = "Comfy.VueNodes.Enabled"  # the frontend's "Modern Node Design (Nodes 2.0)" switch
MATRIX = [("bundled", "classic"), ("newest", "classic"), ("newest", "vue")]


def _strict() -> bool:
    return os.environ.get("QWEN3TTS_STRICT_TESTS") == "1"


def _start(name: str, comfy_base: Path, tmp: Path) -> dict:
    """ComfyUI 0.3.75 + chromium with the "bundled" or the "newest" frontend."""
    chromium = chromium_path()
    if not chromium:
        if _strict():
            pytest.fail("QWEN3TTS_STRICT_TESTS=1 but no chromium: apt-get install -y chromium (or set CHROMIUM=/path)")
        pytest.skip("no chromium: apt-get install -y chromium (or set CHROMIUM=/path)")
    frontend = None
    if name == "newest":
        frontend = client.newest_frontend(Path(COMFYUI_DIR))
        if frontend is None:
            why = "the newest frontend is not installed: run scripts/setup_frontend_newest.sh VENV WORK"
            pytest.fail(f"QWEN3TTS_STRICT_TESTS=1 but {why}") if _strict() else pytest.skip(why)
    from tests.support.cdp import page_ws_url, start_chromium

    port, cport = free_port(), free_port()
    proc = client.start_comfy(Path(COMFYUI_DIR), comfy_base, port, comfy_base / f"comfyui-browser-{name}.log",
                              frontend=frontend)
    browser = start_chromium(chromium, cport, tmp / "profile", tmp / "chromium.log")
    stack = {"name": name, "url": f"http://127.0.0.1:{port}", "comfy": client.Comfy(port), "procs": (browser, proc),
             "packages": (frontend / "VERSIONS").read_text().strip() if frontend else "bundled with ComfyUI 0.3.75"}
    try:
        stack["comfy"].wait_up(proc)
        page_ws_url(cport)  # chromium is up
        stack["cdp_port"] = cport
    except Exception:
        _stop(stack)
        raise
    return stack


def _stop(stack: dict) -> None:
    browser, proc = stack["procs"]
    browser.terminate()
    browser.wait(timeout=20)
    client.stop_comfy(proc)


@pytest.fixture(scope="module")
def stacks(comfy_base, tmp_path_factory):
    """stacks(name) -> the running stack for that frontend; one at a time (the matrix runs grouped by frontend,
    so each ComfyUI starts once)."""
    running: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in running:
            for other in list(running):
                _stop(running.pop(other))
            running[name] = _start(name, comfy_base, tmp_path_factory.mktemp(f"chromium-{name}"))
        return running[name]

    yield get
    for stack in running.values():
        _stop(stack)


DIALOG = "[role=dialog] *, .p-dialog *"  # the template browser: PrimeVue dialog (1.32) or role=dialog (1.58)


async def _open_template(page, name: str, node_type: str) -> str:
    """Open `name` through the template browser UI as a user would (our category, then our card); returns how
    it was opened."""
    await page.eval("window.app.graph.clear(); true")
    await page.eval("window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    try:
        for text, what in ((FOLDER, "our category in the template browser"), (name, "our template card")):
            await page.wait_for(f"""(() => {{
                const el = [...document.querySelectorAll({json.dumps(DIALOG)})].find(e => e.children.length === 0
                    && e.textContent.trim() === {json.dumps(text)});
                if (el) el.click();
                return !!el; }})()""", 20, what)
        await page.wait_for(f"window.app.graph._nodes.some(n => n.type === {json.dumps(node_type)})", 20)
        await page.wait_for("!document.querySelector('[role=dialog], .p-dialog')", 10, "the dialog to close")
        return "template browser"
    except TimeoutError:
        # Same code path as the template browser's own load, minus the clicks.
        await page.send("Input.dispatchKeyEvent", type="keyDown", key="Escape", code="Escape",
                        windowsVirtualKeyCode=27)
        await page.send("Input.dispatchKeyEvent", type="keyUp", key="Escape", code="Escape", windowsVirtualKeyCode=27)
        await page.eval(f"""fetch('/api/workflow_templates/{FOLDER}/{name}.json').then(r => r.json())
            .then(wf => window.app.loadGraphData(wf, true, true, {json.dumps(name)})).then(() => true)""")
        await page.wait_for(f"window.app.graph._nodes.some(n => n.type === {json.dumps(node_type)})", 20)
        return "loadGraphData (template browser click path failed)"


def _visible(selector: str) -> str:
    """JS: how many elements match `selector` and are laid out with a non-zero box inside the window."""
    return f"""[...document.querySelectorAll({json.dumps(selector)})].filter(e => {{
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && r.bottom > 0 && r.right > 0 && r.top < innerHeight &&
               r.left < innerWidth; }}).length"""


async def _click(page, selector: str, index: int) -> None:
    """A real mouse click (CDP input events) at the centre of the index-th match, as a user would do it:
    fails if the element is covered (the canvas or another node would get the click instead)."""
    box = await page.eval(f"""(() => {{ const e = document.querySelectorAll({json.dumps(selector)})[{index}];
        e.scrollIntoView({{block: 'nearest'}}); const r = e.getBoundingClientRect();
        const x = r.left + r.width / 2, y = r.top + r.height / 2;
        return {{x, y, hit: document.elementFromPoint(x, y) === e}}; }})()""")
    assert box["hit"], f"{selector}[{index}] is covered by another element at {box}"
    for kind in ("mousePressed", "mouseReleased"):
        await page.send("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1)


async def _frame(page, node_type: str) -> None:
    """Centre the canvas on the first node of `node_type` at zoom 1 (Vue nodes render only what is in view)."""
    await page.eval(f"""(() => {{ const c = window.app.canvas;
        const n = window.app.graph._nodes.find(n => n.type === {json.dumps(node_type)});
        const w = c.canvas.clientWidth, h = c.canvas.clientHeight;
        c.ds.scale = 1;
        c.ds.offset[0] = w / 2 - (n.pos[0] + n.size[0] / 2);
        c.ds.offset[1] = h / 2 - (n.pos[1] + n.size[1] / 2);
        c.setDirty(true, true);
        return true; }})()""")
    await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def _session(stack: dict, renderer: str):
    """A fresh browser tab on `stack` with the renderer switched on or off and an empty output cache (a cached
    loader sends no UI, so it would show no info box). Yields (page, frontend version)."""
    import aiohttp
    from tests.support.cdp import Page, close_tab, new_tab

    status, _ = stack["comfy"].post(f"/api/settings/{VUE_SETTING}", renderer == "vue")
    assert status == 200
    assert stack["comfy"].post("/free", {"unload_models": True, "free_memory": True})[0] == 200
    tab = new_tab(stack["cdp_port"])
    try:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                for domain in ("Runtime", "Page", "Log"):
                    await page.send(f"{domain}.enable")
                await page.send("Page.navigate", url=stack["url"])
                await page.wait_for("!!(window.app && window.app.graph && window.app.extensionManager)", 90,
                                    "the ComfyUI frontend")
                await page.wait_for("document.querySelector('canvas') !== null", 30)
                version = await page.eval("window.__COMFYUI_FRONTEND_VERSION__ || 'unknown'")
                vue = await page.eval(f"!!window.app.extensionManager.setting.get({json.dumps(VUE_SETTING)})")
                assert vue == (renderer == "vue"), f"{VUE_SETTING} is {vue}, wanted {renderer}"
                yield page, version
    finally:
        close_tab(stack["cdp_port"], tab)


def _check_console(console: list[dict]) -> None:
    """Print every console error; fail on those from the pack (cdp.from_pack)."""
    from tests.support.cdp import from_pack

    errors = [e for e in console if e["level"] == "error"]
    for e in errors:
        print("console error:", e["source"], e["text"][:600], [u for u in e["urls"] if u][:4])
    ours = [e for e in errors if from_pack(e, FOLDER, PACK_MARKERS)]
    assert ours == [], f"console errors from the pack: {ours}"


@pytest.mark.parametrize("frontend, renderer", MATRIX, ids=[f"{f}-{r}" for f, r in MATRIX])
def test_takes_widget_and_streaming_player(stacks, frontend, renderer, artifacts):
    stack = stacks(frontend)
    tag = f"{frontend}-{renderer}"
    listed = stack["comfy"].get("/api/workflow_templates")
    assert {"qwen3tts_custom_voice_takes", "qwen3tts_streaming"} <= set(listed.get(FOLDER, []))

    async def go():
        async with _session(stack, renderer) as (page, version):
            print("streaming underruns are expected where RTF < 1 (slower than real time)")
            how = await _open_template(page, "qwen3tts_custom_voice_takes", "Qwen3TTSFast_PickTake")
            if renderer == "vue":
                await page.wait_for("document.querySelectorAll('[data-node-id]').length > 0", 20,
                                    "Vue-rendered nodes")
            await page.eval("window.app.queuePrompt(0, 1)")
            await page.wait_for("document.querySelectorAll('.qwen3tts-take audio').length", 240,
                                "the takes widget")
            await _frame(page, "Qwen3TTSFast_PickTake")
            await page.screenshot(artifacts / f"{tag}-takes_widget.png")
            shown = await page.eval(_visible(".qwen3tts-take audio"))
            assert shown == 4, f"the takes widget shows {shown} of 4 players"
            await _click(page, ".qwen3tts-use-take", 2)
            index = await page.eval(
                "window.app.graph._nodes.find(n => n.type === 'Qwen3TTSFast_PickTake')"
                ".widgets.find(w => w.name === 'index').value")
            queued = await page.eval("window.app.graphToPrompt().then(p => Object.values(p.output)"
                                     ".find(n => n.class_type === 'Qwen3TTSFast_PickTake').inputs.index)")
            assert index == 2 and queued == 2, (index, queued)
            await _frame(page, "Qwen3TTSFast_LoadQwen3TTS")
            await page.screenshot(artifacts / f"{tag}-loader_info.png")
            info = await page.eval("[...document.querySelectorAll('.qwen3tts-info pre')]"
                                   ".map(e => e.textContent).join('\\n')")
            info_shown = await page.eval(_visible(".qwen3tts-info pre"))

            how2 = await _open_template(page, "qwen3tts_streaming", "Qwen3TTSFast_StreamChunks")
            await page.eval("window.app.queuePrompt(0, 1)")
            await page.wait_for("window.__qwen3ttsStream && Object.values(window.__qwen3ttsStream)"
                                ".some(s => s.done)", 240, "the end of the stream")
            st = await page.eval("JSON.stringify(Object.values(window.__qwen3ttsStream).find(s => s.done))")
            await _frame(page, "Qwen3TTSFast_StreamChunks")
            await page.screenshot(artifacts / f"{tag}-streaming_player.png")
            text = await page.eval("[...document.querySelectorAll('.qwen3tts-stream-status')]"
                                   ".map(e => e.textContent).join('\\n')")
            status_shown = await page.eval(_visible(".qwen3tts-stream-status"))
            return version, how, how2, json.loads(st), info, info_shown, text, status_shown, page.console

    version, how, how2, st, info, info_shown, text, status_shown, console = asyncio.run(go())
    print(f"{tag}: frontend {version} ({stack['packages']}); opened via {how} / {how2}")
    assert how == how2 == "template browser"
    assert "device" in info and "kernels" in info and info_shown >= 1, f"loader info box: {info!r}"
    assert st["chunks"] >= 3 and st["seqs"] == list(range(st["chunks"]))
    # Back to back whenever a chunk arrives in time; on this CPU (RTF < 1) a late chunk is an underrun
    # that the player counts as a gap and restarts after. Never overlapping.
    pairs = list(zip(st["scheduled"], st["scheduled"][1:]))
    back_to_back = sum(abs(t0 + d0 - t1) < 1e-6 for (t0, d0), (t1, _) in pairs)
    assert all(t1 >= t0 + d0 - 1e-6 for (t0, d0), (t1, _) in pairs)
    assert back_to_back + st["gaps"] == len(pairs)
    assert st["ttfaClient"] is not None and st["rtf"] > 0
    assert "TTFA" in text and "RTF" in text and status_shown >= 1
    _check_console(console)


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


@pytest.mark.parametrize("frontend, renderer", MATRIX, ids=[f"{f}-{r}" for f, r in MATRIX])
def test_pick_loop_reruns_only_pick_take(stacks, frontend, renderer, comfy_base, artifacts):
    """Run the takes workflow with the seed left on randomize, pick take 2 with 'use this take', queue again:
    the generator is not run again (ComfyUI serves it from its cache) and the saved output is take 2 of the
    first run, sample for sample. Also: every example workflow's Note is at most 360 px wide and covers no node."""
    from tests.support._q3support import read_audio

    stack = stacks(frontend)
    comfy = stack["comfy"]
    seed = 4343  # the output cache is emptied first (_session), so the first run really generates

    async def go():
        async with _session(stack, renderer) as (page, _version):
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

            await _frame(page, "Qwen3TTSFast_PickTake")
            await _click(page, ".qwen3tts-use-take", 2)
            picked = json.loads(await page.eval(f"""JSON.stringify({{
                index: window.app.graph._nodes.find(n => n.type === 'Qwen3TTSFast_PickTake')
                    .widgets.find(w => w.name === 'index').value,
                seed: ({widget})('seed').value, control: ({widget})('control_after_generate').value,
                note: document.querySelector('.qwen3tts-take-note').textContent,
                origin: document.querySelectorAll('.qwen3tts-take-origin')[2].textContent}})"""))
            await asyncio.sleep(0.3)
            await page.screenshot(artifacts / f"{frontend}-{renderer}-pick_loop_pinned.png")
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
    _check_console(console)
