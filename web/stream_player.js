// Qwen3-TTS Fast: streaming player of StreamChunks. Listens for the pack's websocket event, schedules
// every chunk back to back with Web Audio (gap-free), and shows time to first audio and RTF live.
// Time to first audio is what the user waits: from queueing the prompt to the first chunk being scheduled.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const EVENT = "qwen3tts_fast.stream";
const NODE = "Qwen3TTSFast_StreamChunks";
const LEAD_S = 0.08; // initial scheduling lead so the first chunk never starts late

// Inspectable state (also used by the browser test): one entry per node id.
const state = (window.__qwen3ttsStream = window.__qwen3ttsStream || {});
let ctx = null;
// prompt id -> performance.now() when this page heard the prompt start (execution_start): where the server
// does not say when the prompt was queued, the clock starts there.
const started = new Map();
const STARTED_KEPT = 64;

// Where the first-audio clock of a stream starts. The server sends when ComfyUI queued the prompt (queued_ms)
// and when it sent this message (sent_ms), both on its own clock, so their difference needs no clock sync.
function clockStart(d) {
  const now = performance.now();
  if (Number.isFinite(d.queued_ms) && Number.isFinite(d.sent_ms) && d.sent_ms >= d.queued_ms) {
    return { t0: now - (d.sent_ms - d.queued_ms), from: "queue" };
  }
  if (d.prompt_id != null && started.has(d.prompt_id)) return { t0: started.get(d.prompt_id), from: "prompt start" };
  return { t0: now, from: "stream start" };
}

function onExecutionStart(d) {
  if (d?.prompt_id == null) return;
  started.set(d.prompt_id, performance.now());
  if (started.size > STARTED_KEPT) started.delete(started.keys().next().value);
}

function audioContext() {
  if (!ctx) ctx = new (window.AudioContext || window.webkitAudioContext)();
  if (ctx.state === "suspended") ctx.resume().catch(() => {});
  return ctx;
}

function decodePcm(b64) {  // the node sends little-endian float32 ("f32le")
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

function statusBox(node) {
  if (!node.__qwen3ttsStatus) {
    const el = document.createElement("div");
    el.className = "qwen3tts-stream-status";
    el.style.cssText = "font:11px monospace;color:var(--input-text,#ddd);white-space:pre;padding:2px;";
    el.textContent = "stream player: idle";
    node.addDOMWidget("stream_status", "qwen3tts_box", el, { serialize: false });
    node.__qwen3ttsStatus = el;
  }
  return node.__qwen3ttsStatus;
}

function show(id) {
  const s = state[id];
  const node = app.graph?.getNodeById?.(Number(id));
  if (!s || !node) return;
  const ttfa = s.ttfaClient == null ? "-" : `${(s.ttfaClient * 1000).toFixed(0)} ms`;
  const ttfaSrv = s.ttfaServer == null ? "-" : `${(s.ttfaServer * 1000).toFixed(0)} ms`;
  // RTF as everywhere in this pack: seconds of audio per second of wall time (above 1 = faster than real time)
  const rtf = s.rtf == null ? "-" : `${s.rtf.toFixed(2)}x`;
  statusBox(node).textContent =
    `${s.done ? "done" : "streaming"}  chunks ${s.chunks}  audio ${s.audioS.toFixed(2)} s\n` +
    `TTFA ${ttfa} from ${s.from} (engine ${ttfaSrv})  RTF ${rtf}  gaps ${s.gaps}`;
}

function onEvent(d) {
  const id = String(d.node);
  if (d.phase === "start") {
    const c = audioContext();
    const { t0, from } = clockStart(d);
    state[id] = { t0, from, sampleRate: d.sample_rate, nextTime: c.currentTime + LEAD_S, chunks: 0,
      seqs: [], audioS: 0, gaps: 0, ttfaClient: null, ttfaServer: null, rtf: null, done: false, scheduled: [] };
  } else if (d.phase === "chunk") {
    const s = state[id];
    if (!s) return;
    const c = audioContext();
    const pcm = decodePcm(d.pcm);
    const buf = c.createBuffer(1, pcm.length, s.sampleRate);
    buf.copyToChannel(pcm, 0);
    const src = c.createBufferSource();
    src.buffer = buf;
    src.connect(c.destination);
    if (s.nextTime < c.currentTime) { s.gaps += s.chunks > 0 ? 1 : 0; s.nextTime = c.currentTime + LEAD_S; }
    src.start(s.nextTime);
    // heard when it starts playing: the wait so far plus the scheduling lead still ahead
    if (s.ttfaClient == null) s.ttfaClient = (performance.now() - s.t0) / 1000 + (s.nextTime - c.currentTime);
    s.scheduled.push([s.nextTime, buf.duration]);
    s.nextTime += buf.duration;
    s.chunks += 1;
    s.seqs.push(d.seq);
    s.audioS += pcm.length / s.sampleRate;
    s.ttfaServer = d.ttfa_s;
    s.rtf = d.audio_s / Math.max(d.elapsed_s, 1e-9);
  } else if (d.phase === "end") {
    const s = state[id];
    if (!s) return;
    s.done = true;
    s.rtf = d.rtf;
  }
  show(id);
}

app.registerExtension({
  name: "qwen3tts_fast.stream_player",
  setup() {
    api.addEventListener("execution_start", (e) => onExecutionStart(e.detail));
    api.addEventListener(EVENT, (e) => onEvent(e.detail));
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE) return;
    const orig = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = orig?.apply(this, arguments);
      statusBox(this);
      return r;
    };
  },
});
