"""Draw example_workflows/<name>.jpg: a small diagram of each workflow's nodes and links (Pillow).

    python scripts/draw_thumbnails.py
"""
from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

DIR = Path(__file__).resolve().parents[1] / "example_workflows"
W, H = 640, 400
COLORS = {"Qwen3TTSFast_": (64, 110, 170), "Note": (90, 90, 60)}


def label(typ: str) -> str:
    return typ.replace("Qwen3TTSFast_", "").replace("LoadQwen3TTS", "Load Qwen3-TTS")


def draw(path: Path) -> None:
    wf = json.loads(path.read_text())
    nodes = {n["id"]: n for n in wf["nodes"] if n["type"] != "Note"}
    xs = [n["pos"][0] for n in nodes.values()] + [n["pos"][0] + n["size"][0] for n in nodes.values()]
    scale = (W - 40) / max(1, max(xs) - min(xs))
    img = Image.new("RGB", (W, H), (32, 32, 36))
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    title = path.stem.replace("qwen3tts_", "Qwen3-TTS: ").replace("_", " ")
    d.text((20, 16), title, fill=(235, 235, 235), font=font)
    boxes = {}
    for i, (nid, n) in enumerate(nodes.items()):
        x0 = 20 + (n["pos"][0] - min(xs)) * scale
        y0 = 90 + (i % 2) * 120
        x1 = x0 + max(60, n["size"][0] * scale - 8)
        boxes[nid] = (x0, y0, x1, y0 + 80)
    for link in wf["links"]:
        a, b = boxes.get(link[1]), boxes.get(link[3])
        if a and b:
            d.line([(a[2], a[1] + 40), (b[0], b[1] + 40)], fill=(160, 160, 90), width=3)
    for nid, n in nodes.items():
        color = next((c for k, c in COLORS.items() if n["type"].startswith(k)), (70, 70, 78))
        d.rounded_rectangle(boxes[nid], radius=8, fill=color, outline=(200, 200, 210))
        d.text((boxes[nid][0] + 6, boxes[nid][1] + 8), label(n["type"]), fill=(255, 255, 255), font=font)
    d.text((20, H - 30), "Qwen3-TTS Fast for ComfyUI", fill=(150, 150, 160), font=font)
    img.save(path.with_suffix(".jpg"), quality=88)


if __name__ == "__main__":
    for p in sorted(DIR.glob("*.json")):
        draw(p)
        print("drew", p.with_suffix(".jpg"))
