"""Long text and dialogue scripts as batch rows (Engine.generate (a list)) against the same pieces generated one
by one (Engine.generate), in the same run, on a random CustomVoice checkpoint with EOS disabled and every
piece given its natural length (12.5 frames/s at ~2.7 English words/s or ~4.5 CJK characters/s).

    .venv/bin/python bench/batch_bench.py                       # CUDA: 0.6B bf16, 2,000 words, 40 lines
    .venv/bin/python bench/batch_bench.py --size tiny --words 300 --lines 12 --out DIR   # CPU, as in CI

Cases: "text" is one English text split as the generator nodes split it (nodes/text_split.py);
"script" is a 3-speaker dialogue, one row per line with that line's speaker. Writes
OUT/batch_<device>.json and .md and prints the table. Exits 1 when a batched run is slower than the
sequential one (the CI check on CPU); the GPU targets are read from the table, never asserted.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch
from timing import write_json  # bench/ is on sys.path when a bench runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import BatchItem, Engine, Request  # noqa: E402
from engine.checkpoint.writer import ensure_random_checkpoint  # noqa: E402

FRAMES_PER_S = 12.5
WORDS_PER_S = 2.7
WORDS = ("the a of and to in that it was he she they we you for on with as at by from this but not all one "
         "what there when up out about who get which go me would make like time just him know take people into "
         "year your good some could them see other than then now look only come its over think also back after "
         "use two how our work first well way even new want because any these give day most us river morning "
         "light house window garden letter journey winter summer city road forest voice story evening quiet "
         "friend mother father child teacher doctor market station bridge mountain valley ocean island music "
         "paper table kitchen door street village harbour ship train bread coffee rain wind snow fire stone "
         "slowly quickly always never often suddenly carefully together already almost perhaps finally still "
         "walked looked said asked turned opened closed waited listened watched smiled remembered believed "
         "found carried followed reached wondered decided returned noticed answered explained").split()


def _split_module():
    """nodes/text_split.py on its own (pure Python; importing the nodes package would need ComfyUI)."""
    spec = importlib.util.spec_from_file_location("text_split", ROOT / "nodes" / "text_split.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    if len(words) > 9 and rng.random() < 0.5:
        words[rng.randint(3, len(words) - 4)] += ","
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])


def long_text(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out, count = [], 0
    while count < words:
        s = sentence(rng, 6, 24)
        out.append(s + ("\n\n" if rng.random() < 0.15 else " "))
        count += len(s.split())
    return "".join(out).strip()


def natural_frames(text: str) -> int:
    return max(2, round(len(text.split()) / WORDS_PER_S * FRAMES_PER_S))


def text_items(words: int, max_seq_len: int) -> list:
    ts = _split_module()
    pieces = ts.split_text(long_text(words), ts.segment_budget(ts.DEFAULT_MAX_UNITS, max_seq_len))
    return [BatchItem(Request(mode="custom", text=p, language="English", speaker="ryan"), seed=k,
                      max_new_tokens=natural_frames(p)) for k, p in enumerate(pieces)]


def script_items(lines: int, speakers: list) -> list:
    rng = random.Random(1)
    cast = speakers[:3]
    items = []
    for k in range(lines):
        text = " ".join(sentence(rng, 3, 14) for _ in range(rng.choice([1, 1, 2])))
        items.append(BatchItem(Request(mode="custom", text=text, language="English", speaker=cast[k % 3]),
                               seed=k, max_new_tokens=natural_frames(text)))
    return items


def sync(engine):
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def run_batched(engine, items, max_rows: int) -> dict:
    sync(engine)
    t0 = time.perf_counter()
    results = engine.generate(items, params=engine.defaults, max_rows=max_rows)
    sync(engine)
    wall = time.perf_counter() - t0
    for item, res in zip(items, results):
        assert res.lengths == [item.max_new_tokens * 1920] * item.takes, "EOS must be disabled"
    st = results[0].stats
    return {"wall_s": wall, "decode_s": st["decode_s"], "codec_s": st["codec_s"], "batch": st["batch"]}


def run_sequential(engine, items) -> dict:
    sync(engine)
    t0 = time.perf_counter()
    for item in items:
        res = engine.generate(item.request, takes=item.takes, seed=item.seed,
                              params=engine.defaults.replace(max_new_tokens=item.max_new_tokens))
        assert res.lengths == [item.max_new_tokens * 1920] * item.takes
    sync(engine)
    return {"wall_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--size", default=None, help="checkpoint size (default 0.6b on CUDA, tiny on CPU)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--words", type=int, default=2000)
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run both modes this many times, alternating, and keep each mode's fastest (a loaded "
                         "machine's noise then cannot decide the comparison)")
    args = ap.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    size = args.size or ("0.6b" if device == "cuda" else "tiny")
    ckpt = ROOT / ".cache" / "bench" / f"random-{size}-custom_voice"
    ensure_random_checkpoint(ckpt, size, "custom_voice")
    engine = Engine.load(ckpt, device=device, dtype=args.dtype, max_takes=args.max_rows)
    print(engine.info.summary(), flush=True)
    cases = {"text": text_items(args.words, engine.config.max_seq_len), "script": script_items(args.lines, engine.speakers)}

    if engine.info.cuda_graphs:  # every graph bucket and attention window either mode uses is captured here
        longest = max((i for items in cases.values() for i in items), key=lambda i: i.max_new_tokens)
        run_sequential(engine, [longest])
        for items in cases.values():
            run_batched(engine, items, args.max_rows)

    rows = []
    for name, items in cases.items():
        audio_s = sum(i.max_new_tokens * i.takes for i in items) / FRAMES_PER_S
        seq = bat = None
        for _ in range(max(1, args.repeats)):
            s_run = run_sequential(engine, items)
            b_run = run_batched(engine, items, args.max_rows)
            seq = s_run if seq is None or s_run["wall_s"] < seq["wall_s"] else seq
            bat = b_run if bat is None or b_run["wall_s"] < bat["wall_s"] else bat
        for mode, r in (("sequential", seq), ("batched", bat)):
            row = {"case": name, "mode": mode, "pieces": len(items), "audio_s": round(audio_s, 1),
                   "wall_s": round(r["wall_s"], 3), "x_real_time": round(audio_s / r["wall_s"], 1)}
            if mode == "batched":
                row.update(slots=r["batch"]["slots"], occupancy=round(r["batch"]["occupancy"], 3),
                           decode_s=round(r["decode_s"], 3), codec_s=round(r["codec_s"], 3),
                           speedup=round(seq["wall_s"] / r["wall_s"], 2))
            rows.append(row)
            print(json.dumps(row), flush=True)

    name = "cuda" if device == "cuda" else "cpu"
    gpu = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    meta = {"device": gpu, "torch": torch.__version__, "size": size, "engine": engine.info.summary(),
            "words": args.words, "lines": args.lines, "max_rows": args.max_rows, "repeats": args.repeats,
            "eos": "disabled; every piece decodes its natural frame count"}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"batch_{name}.json", {"meta": meta, "rows": rows})
    head = "| case | mode | pieces | audio s | wall s | × real time | slots | occupancy | speed-up |"
    lines = [f"# Batch rows vs one by one ({gpu}, {size} CustomVoice, {engine.info.dtype})", "",
             f"{args.words}-word English text split as the nodes split it; {args.lines}-line 3-speaker script; "
             f"EOS disabled, natural frame counts; fastest of {args.repeats} alternating run(s) per mode.", "", head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['case']} | {r['mode']} | {r['pieces']} | {r['audio_s']} | {r['wall_s']} | "
                     f"{r['x_real_time']} | {r.get('slots', 1)} | {r.get('occupancy', '')} | {r.get('speedup', '')} |")
    table = "\n".join(lines) + "\n"
    (args.out / f"batch_{name}.md").write_text(table)
    print(table)
    slower = [r["case"] for r in rows if r["mode"] == "batched" and r["speedup"] < 1.0]
    if slower:
        print(f"FAIL: batched slower than sequential for {slower}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
