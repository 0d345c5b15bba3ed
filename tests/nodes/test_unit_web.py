"""The web extensions' logic, run in Node.js against stand-ins of the frontend (no browser): the takes widget uses
the frontend's connectivity API, and the stream player times first audio from the queue."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.support._q3support import PACK

WEB = PACK / "web"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js not installed (apt-get install -y nodejs)")

# Loads a web/ file as a plain function body: its imports become the stand-ins in globalThis.__stubs, and the
# names listed after it are handed back. Then the case given on stdin runs and prints JSON.
HARNESS = r"""
const fs = require("fs");
const [file, names, body] = JSON.parse(fs.readFileSync(0, "utf8"));
let src = fs.readFileSync(file, "utf8").replace(/^import .*$/gm, "");
src = "const { app, api } = globalThis.__stubs;\n" + src + `\nreturn { ${names.join(", ")} };`;
globalThis.__load = () => new Function(src)();
(async () => { console.log(JSON.stringify(await new Function(body)())); })();
"""


def run_js(tmp_path, file: str, names: list[str], body: str):
    harness = tmp_path / "harness.cjs"
    harness.write_text(HARNESS)
    proc = subprocess.run([NODE, str(harness)], input=json.dumps([str(WEB / file), names, body]), text=True,
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_web_file_reads_the_deprecated_slot_link_fields():
    """Frontend 1.58 warns on input.link / output.links: connectivity is read through the node's methods."""
    for path in WEB.glob("*.js"):
        code = re.sub(r"//.*", "", path.read_text())
        assert not re.search(r"\.links?\b(?!\s*\()", code), f"{path.name} reads .link/.links of a slot"


PIN = r"""
globalThis.__stubs = { app: { registerExtension() {}, graph: {} }, api: {} };
const { pinGenerator } = globalThis.__load();
function generator(connected) {
  const seedInput = { name: "seed" };
  Object.defineProperty(seedInput, "link", { get() { throw new Error("input.link read"); } });
  const control = { name: "control_after_generate", value: "randomize" };
  const seed = { name: "seed", value: 99, linkedWidgets: [control] };
  return { type: "Qwen3TTSFast_CustomVoice", title: "", inputs: [{ name: "text" }, seedInput],
           isInputConnected: (slot) => slot === 1 && connected, widgets: [seed, control], seed, control };
}
const out = {};
for (const connected of [true, false]) {
  const gen = generator(connected);
  const pick = { inputs: [{ name: "audio" }], getInputNode: () => gen };
  const r = pinGenerator(pick, { seed: 1234, take: 2 });
  out[connected] = { text: r.text, seed: gen.seed.value, control: gen.control.value };
}
return out;
"""


@needs_node
def test_use_this_take_reads_the_seed_link_through_the_node_api(tmp_path):
    out = run_js(tmp_path, "takes.js", ["pinGenerator"], PIN)
    assert "seed comes from a link" in out["true"]["text"] and out["true"]["seed"] == 99
    assert out["false"] == {"text": out["false"]["text"], "seed": 1234, "control": "fixed"}
    assert "Pinned CustomVoice" in out["false"]["text"]


STREAM = r"""
let now = 10000;
globalThis.performance = { now: () => now };
class Ctx { constructor() { this.currentTime = 0; this.state = "running"; }
  createBuffer(ch, n, sr) { return { duration: n / sr, copyToChannel() {} }; }
  createBufferSource() { return { connect() {}, start() {} }; } }
globalThis.window = { AudioContext: Ctx };
globalThis.atob = (b) => Buffer.from(b, "base64").toString("binary");
globalThis.__stubs = { app: { registerExtension() {}, graph: { getNodeById: () => null } }, api: {} };
const { onEvent, onExecutionStart, state } = globalThis.__load();
const pcm = Buffer.from(new Float32Array(2400).buffer).toString("base64");
const chunk = (node) => ({ phase: "chunk", node, seq: 0, pcm, ttfa_s: 0.05, audio_s: 0.1, elapsed_s: 0.05 });
const out = {};
// the server says the prompt was queued 1500 ms before it sent the start message; the chunk comes 200 ms later
onEvent({ phase: "start", node: "1", prompt_id: "a", sample_rate: 24000, queued_ms: 5000, sent_ms: 6500 });
now += 200; onEvent(chunk("1"));
out.queue = [state["1"].from, state["1"].ttfaClient];
// no queue time from the server: from when this page heard the prompt start
now = 20000; onExecutionStart({ prompt_id: "b" });
now = 21000; onEvent({ phase: "start", node: "2", prompt_id: "b", sample_rate: 24000, queued_ms: null, sent_ms: 1 });
now += 300; onEvent(chunk("2"));
out.prompt = [state["2"].from, state["2"].ttfaClient];
// nothing known: from the stream's start message
now = 30000; onEvent({ phase: "start", node: "3", prompt_id: "c", sample_rate: 24000 });
now += 100; onEvent(chunk("3"));
out.stream = [state["3"].from, state["3"].ttfaClient];
return out;
"""


@needs_node
def test_stream_player_times_first_audio_from_the_queue(tmp_path):
    out = run_js(tmp_path, "stream_player.js", ["onEvent", "onExecutionStart", "state"], STREAM)
    lead = 0.08  # LEAD_S: the first chunk is scheduled that far ahead, and heard then
    assert out["queue"][0] == "queue" and out["queue"][1] == pytest.approx(1.5 + 0.2 + lead)
    assert out["prompt"][0] == "prompt start" and out["prompt"][1] == pytest.approx(1.0 + 0.3 + lead)
    assert out["stream"][0] == "stream start" and out["stream"][1] == pytest.approx(0.1 + lead)
