// Qwen3-TTS Fast: the takes widget of PickTake (one player + duration per take, "use this take"),
// and the "what actually runs" box of LoadQwen3TTS.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const PREFIX = "Qwen3TTSFast_";

function viewUrl(f) {
  const q = new URLSearchParams({ filename: f.filename, subfolder: f.subfolder || "", type: f.type || "temp" });
  return api.apiURL(`/view?${q.toString()}`);
}

function ensureBox(node, name, cls) {
  if (!node.__qwen3ttsBoxes) node.__qwen3ttsBoxes = {};
  if (!node.__qwen3ttsBoxes[name]) {
    const el = document.createElement("div");
    el.className = cls;
    el.style.cssText = "font:12px sans-serif;color:var(--input-text,#ddd);display:flex;flex-direction:column;gap:4px;overflow:auto;";
    node.addDOMWidget(name, "qwen3tts_box", el, { serialize: false, hideOnZoom: false });
    node.__qwen3ttsBoxes[name] = el;
  }
  return node.__qwen3ttsBoxes[name];
}

// The node whose AUDIO feeds PickTake (through reroutes the frontend resolves itself).
function sourceNode(node) {
  const slot = node.inputs?.findIndex((i) => i.name === "audio") ?? -1;
  return slot >= 0 ? node.getInputNode?.(slot) ?? null : null;
}

// "use this take" must never make the next queue run the generator again: its seed goes back to the seed
// these takes came from and its control_after_generate to "fixed". Returns what was changed, or why not.
function pinGenerator(node, take) {
  const gen = sourceNode(node);
  if (!gen || !String(gen.type || "").startsWith(PREFIX)) {
    return { warn: true, text: "The takes do not come straight from a Qwen3-TTS generator: set its seed to " +
      "'fixed' yourself, or the next queue makes new takes." };
  }
  const name = gen.title || gen.type.slice(PREFIX.length);
  // The frontend's connectivity API (input.link is deprecated since frontend 1.58; isInputConnected exists in
  // every frontend ComfyUI 0.3.75 runs with).
  const seedSlot = gen.inputs?.findIndex((i) => i.name === "seed") ?? -1;
  if (seedSlot >= 0 && gen.isInputConnected?.(seedSlot)) {
    return { warn: true, text: `${name}'s seed comes from a link: keep that value fixed, or the next queue ` +
      "makes new takes." };
  }
  const seed = gen.widgets?.find((w) => w.name === "seed");
  const control = seed?.linkedWidgets?.find((w) => w.name === "control_after_generate") ??
    gen.widgets?.find((w) => w.name === "control_after_generate");
  const changes = [];
  if (control && control.value !== "fixed") {
    changes.push(`control_after_generate '${control.value}' → 'fixed'`);
    control.value = "fixed";
    control.callback?.("fixed");
  }
  if (seed && take.seed !== undefined && seed.value !== take.seed) {
    changes.push(`seed ${seed.value} → ${take.seed} (the seed of these takes)`);
    seed.value = take.seed;
    seed.callback?.(take.seed);
  }
  if (!changes.length) return { warn: false, text: "Queue again: only PickTake re-runs." };
  return { warn: true, text: `Pinned ${name}: ${changes.join(", ")}, so the next queue re-runs only ` +
    "PickTake instead of making new takes." };
}

function renderTakes(node, takes, picked) {
  const box = ensureBox(node, "takes_preview", "qwen3tts-takes");
  box.replaceChildren();
  const indexWidget = node.widgets?.find((w) => w.name === "index");
  const note = document.createElement("div");
  note.className = "qwen3tts-take-note";
  note.style.cssText = "white-space:normal;";
  for (const t of takes) {
    const row = document.createElement("div");
    row.className = "qwen3tts-take";
    row.dataset.index = String(t.index);
    row.style.cssText = "display:flex;align-items:center;gap:6px;";
    const label = document.createElement("span");
    label.textContent = `#${t.index}  ${Number(t.duration).toFixed(2)} s`;
    label.style.minWidth = "80px";
    if (t.index === picked) label.style.fontWeight = "bold";
    const audio = document.createElement("audio");
    audio.controls = true;
    audio.preload = "none";
    audio.src = viewUrl(t);
    audio.style.cssText = "height:28px;flex:1;min-width:120px;";
    const use = document.createElement("button");
    use.textContent = "use this take";
    use.className = "qwen3tts-use-take";
    use.onclick = () => {
      if (indexWidget) {
        indexWidget.value = t.index;
        indexWidget.callback?.(t.index);
      }
      for (const r of box.querySelectorAll(".qwen3tts-take > span:first-child")) r.style.fontWeight = "normal";
      label.style.fontWeight = "bold";
      const pinned = pinGenerator(node, t);
      note.textContent = (pinned.warn ? "⚠ " : "") + pinned.text;
      note.style.color = pinned.warn ? "var(--error-text, #f0a020)" : "";
      node.setDirtyCanvas?.(true, true);
      app.graph.setDirtyCanvas(true, true);
    };
    row.append(label, audio, use);
    if (t.seed !== undefined) {  // what renders this take alone: same seed, takes 1, first_take = take
      const origin = document.createElement("span");
      origin.className = "qwen3tts-take-origin";
      origin.textContent = `seed ${t.seed} · take ${t.take}`;
      origin.title = `Render this take alone: seed ${t.seed}, takes 1, first_take ${t.take}`;
      origin.style.cssText = "user-select:text;opacity:0.75;font-size:11px;white-space:nowrap;";
      row.insertBefore(origin, audio);
    }
    box.append(row);
  }
  box.append(note);
  const need = 60 + 34 * takes.length;
  if (node.size[1] < need) node.setSize([Math.max(node.size[0], 360), need + 60]);
}

function renderInfo(node, text) {
  const box = ensureBox(node, "runtime_info", "qwen3tts-info");
  box.replaceChildren();
  const pre = document.createElement("pre");
  pre.style.cssText = "margin:0;white-space:pre-wrap;font:11px monospace;";
  pre.textContent = text;
  box.append(pre);
}

app.registerExtension({
  name: "qwen3tts_fast.takes",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name === PREFIX + "PickTake") {
      const orig = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (output) {
        orig?.apply(this, arguments);
        if (output?.qwen3tts_takes) renderTakes(this, output.qwen3tts_takes, output.qwen3tts_picked?.[0] ?? 0);
      };
    } else if (nodeData.name === PREFIX + "LoadQwen3TTS") {
      const orig = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (output) {
        orig?.apply(this, arguments);
        if (output?.text) renderInfo(this, output.text.join("\n"));
      };
    }
  },
});
