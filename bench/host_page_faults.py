"""What it costs the host to receive a request's audio into new memory, size by size (CPU only, no model).

    python bench/host_page_faults.py [--out FILE.json]

Replays the real-length script's audio sizes (bench/real_length_script.py; float32, 1920 samples a frame, at 4
takes and at 1 take) in its order. For each size it times `torch.empty(n)` plus a copy into it, the host side of
`Engine._trim`'s `.cpu()`. The previous result stays alive until the next one is made, as when a caller holds
one. A size larger than any freed before gets fresh pages from the kernel, and each page faults on its first
write. That is the suspect for the 4-take requests whose audio went to the host 4-6 ms slower above ~8 MB
(bench/results/audio_to_host_h100.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_length_script import script  # noqa: E402

from engine.config import SAMPLES_PER_FRAME  # noqa: E402


def run(takes: int, frames: list, src: torch.Tensor) -> list:
    rows, held = [], None
    for f in frames:
        n = takes * f * SAMPLES_PER_FRAME
        t = time.perf_counter()
        out = torch.empty(n)
        out.copy_(src[:n])
        ms = 1000 * (time.perf_counter() - t)
        held = out  # noqa: F841 (the previous result is freed only now)
        rows.append({"takes": takes, "frames": f, "mb": n * 4 / 1e6, "ms": ms, "ms_per_mb": ms / (n * 4 / 1e6)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one copy thread, as a small CPU copy gets
    frames = [f for _, _, f in script()]
    src = torch.ones(4 * max(frames) * SAMPLES_PER_FRAME)
    rows = run(4, frames, src) + run(1, frames, src)
    for takes in (4, 1):
        mine = [r for r in rows if r["takes"] == takes]
        largest = 0.0
        fresh, reused = [], []
        for r in mine:  # "fresh": larger than every earlier result of the run, so new pages
            (fresh if r["mb"] > largest else reused).append(r)
            largest = max(largest, r["mb"])
        big = [r for r in reused if r["mb"] >= 1]
        print(f"{takes} take(s): larger than any before: "
              + ", ".join(f"{r['mb']:.1f} MB {r['ms']:.2f} ms" for r in fresh))
        if big:
            median = sorted(r["ms_per_mb"] for r in big)[len(big) // 2]
            print(f"   sizes >= 1 MB seen before: median {median:.3f} ms/MB")
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
