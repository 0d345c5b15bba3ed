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

function renderTakes(node, takes, picked) {
  const box = ensureBox(node, "takes_preview", "qwen3tts-takes");
  box.replaceChildren();
  const indexWidget = node.widgets?.find((w) => w.name === "index");
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
      for (const r of box.querySelectorAll(".qwen3tts-take span")) r.style.fontWeight = "normal";
      label.style.fontWeight = "bold";
      node.setDirtyCanvas?.(true, true);
      app.graph.setDirtyCanvas(true, true);
    };
    row.append(label, audio, use);
    box.append(row);
  }
  const need = 40 + 34 * takes.length;
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
