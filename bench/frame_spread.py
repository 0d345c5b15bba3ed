"""How much a frame's cost varies from one request to the next, and whether sampling is why.

    python bench/frame_spread.py [--size 0.6b] [--out F.json]

Loads the engine as the node does (random real-size CustomVoice checkpoint), then runs the real-length script
(bench/real_length_script.py) at one take three times: sampling with the model's defaults (every length new),
sampling again, greedy (do_sample and subtalker_dosample off: the sampling kernels only take an argmax), and
sampling with the codec decoded after the last frame instead of beside the frames (sample_no_overlap).
For each request it reports the frames' ms a frame: (wall - prefill - codec after the last frame) / frames.
If the spread between requests shrinks when greedy, the cost of drawing the codes depends on the logits.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_probe import codec_after_frames, load_captured, script_params
from real_length_script import script


def run(eng, greedy: bool) -> list:
    from engine import Request

    rows = []
    for i, (lang, text, frames) in enumerate(script()):
        params = script_params(eng, frames)
        if greedy:
            params = params.replace(do_sample=False, subtalker_dosample=False)
        req = Request(mode="custom", text=text, language=lang, speaker="ryan")
        torch.cuda.synchronize()
        t = time.perf_counter()
        res = eng.generate(req, takes=1, seed=i, params=params)
        wall = 1000 * (time.perf_counter() - t)
        st = res.stats
        per_frame = (wall - 1000 * st["prefill_s"] - 1000 * st["codec_s"]) / frames
        rows.append({"frames": frames, "tokens": st["prompt_tokens"], "wall_ms": wall, "ms_per_frame": per_frame})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    eng = load_captured(args.size, takes=())  # the node's load; the script's first request captures nothing new
    runs = {"sample": run(eng, False), "sample_again": run(eng, False), "greedy": run(eng, True)}
    with codec_after_frames():  # the frames run alone
        runs["sample_no_overlap"] = run(eng, False)
    for name, rows in runs.items():
        long = [r["ms_per_frame"] for r in rows if r["frames"] >= 80]
        print(f"{name:13s} requests of 80+ frames: ms a frame min {min(long):.3f} median {statistics.median(long):.3f} "
              f"max {max(long):.3f} stdev {statistics.stdev(long):.4f}", flush=True)
        print("   " + " ".join(f"{r['frames']}:{r['ms_per_frame']:.3f}" for r in rows if r["frames"] >= 80), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "size": args.size, "runs": runs},
                                       indent=1))


if __name__ == "__main__":
    main()
