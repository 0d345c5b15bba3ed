"""CPU benchmark: our eager engine against the official qwen-tts 0.1.1 on the same random checkpoints,
in the same run. Reports ms per frame at B = 1 and B = 4 takes.

    .venv/bin/python bench/cpu_bench.py [--sizes tiny 0.6b] [--frames-tiny 50] [--frames-real 12]

Writes bench/results/cpu.json and bench/results/cpu.md. Decode length is fixed (EOS disabled in the
checkpoints; upstream gets max_new_tokens = frames + 1, which yields `frames` frames).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch
from timing import best_of, write_json  # bench/ is on sys.path when a bench runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine, Request  # noqa: E402
from engine.checkpoint.writer import ensure_random_checkpoint  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest."


def checkpoint(size: str) -> Path:
    path = ROOT / ".cache" / "bench" / f"random-{size}-custom_voice"
    t = time.perf_counter()
    if ensure_random_checkpoint(path, size, "custom_voice"):
        print(f"built {size} checkpoint in {time.perf_counter() - t:.1f} s", flush=True)
    return path


def time_ours(path: Path, frames: int, takes: int, repeats: int, dtype: str) -> dict:
    engine = Engine.load(path, device="cpu", dtype=dtype)
    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    params = engine.defaults.replace(max_new_tokens=frames)
    engine.generate(req, takes=takes, params=params.replace(max_new_tokens=2))  # warm-up

    def timed(_rep):
        t0 = time.perf_counter()
        res = engine.generate(req, takes=takes, params=params)
        wall = time.perf_counter() - t0
        assert res.codes[0].shape[0] == frames
        return {"decode_ms_per_frame": 1000 * res.stats["decode_s"] / frames, "e2e_ms_per_frame": 1000 * wall / frames,
                "wall_s": wall}

    best = best_of(timed, repeats, key=lambda row: row["e2e_ms_per_frame"])
    engine = None  # free it before the next measurement (the closure above holds the variable)
    gc.collect()
    return best


def time_official(path: Path, frames: int, repeats: int, dtype: str) -> dict:
    from tests.support.oracle import import_qwen_tts

    qwen_tts = import_qwen_tts()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = qwen_tts.Qwen3TTSModel.from_pretrained(str(path), device_map="cpu", dtype=torch_dtype)
    kw = dict(text=TEXT, language="English", speaker="ryan")
    model.generate_custom_voice(max_new_tokens=3, **kw)  # warm-up

    def timed(_rep):
        t0 = time.perf_counter()
        wavs, _ = model.generate_custom_voice(max_new_tokens=frames + 1, **kw)
        wall = time.perf_counter() - t0
        assert len(wavs[0]) == frames * 1920
        return {"e2e_ms_per_frame": 1000 * wall / frames, "wall_s": wall}

    best = best_of(timed, repeats, key=lambda row: row["e2e_ms_per_frame"])
    model = None  # free it before the next measurement (the closure above holds the variable)
    gc.collect()
    return best


def measure(path: Path, size: str, dtype: str, frames: int, repeats: int) -> dict:
    official = time_official(path, frames, repeats, dtype)
    ours1 = time_ours(path, frames, 1, repeats, dtype)
    ours4 = time_ours(path, frames, 4, repeats, dtype)
    return {"size": size, "dtype": dtype, "frames": frames, "official_b1": official, "ours_b1": ours1,
            "ours_b4": ours4, "speedup_b1": official["e2e_ms_per_frame"] / ours1["e2e_ms_per_frame"],
            "b4_over_b1": ours4["e2e_ms_per_frame"] / ours1["e2e_ms_per_frame"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "0.6b"])
    ap.add_argument("--frames-tiny", type=int, default=50)
    ap.add_argument("--frames-real", type=int, default=8)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for size in args.sizes:
        path = checkpoint(size)
        frames = args.frames_tiny if size == "tiny" else args.frames_real
        for dtype in args.dtypes:
            rows.append(measure(path, size, dtype, frames, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    meta = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "sampling": "checkpoint defaults (do_sample)",
            "date": time.strftime("%Y-%m-%d")}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "cpu.json", {"meta": meta, "rows": rows})
    lines = ["| checkpoint | dtype | frames | official B=1 ms/frame | ours B=1 ms/frame (decode only) "
             "| ours B=4 ms/frame | speed-up B=1 | B=4 / B=1 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['size']} CustomVoice | {r['dtype']} | {r['frames']} | {r['official_b1']['e2e_ms_per_frame']:.1f} "
            f"| {r['ours_b1']['e2e_ms_per_frame']:.1f} ({r['ours_b1']['decode_ms_per_frame']:.1f}) "
            f"| {r['ours_b4']['e2e_ms_per_frame']:.1f} | {r['speedup_b1']:.2f}x | {r['b4_over_b1']:.2f}x |")
    table = "\n".join(lines)
    (out / "cpu.md").write_text(f"CPU ({meta['machine']}), {meta['threads']} threads, torch {meta['torch']}, end-to-end per frame "
                                f"(prefill + decode + codec), best of {args.repeats}.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
