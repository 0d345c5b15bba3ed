"""What the first request of each takes count costs after load, and what its graphs take.

    python bench/takes_first_use.py [--size 0.6b] [--takes 2 3 4 8 16] [--warm-takes 1] [--long 1000 2000]
                                    [--root TREE] [--out F.json]

A fresh process loads the engine as the benches do (random real-size CustomVoice checkpoint, graphs on; max_takes
16, and --warm-takes as Engine.load's warm_takes: the loader node passes its max_takes), then
for each takes count in order runs the same 20-frame request twice (Engine.generate, the bench text). The
first of them captures that count's batch bucket (frame windows, codec pieces) unless an earlier count
already did. Per count it reports both walls, the frame-graph and codec capture seconds the first request
added, and the device memory it reserved. Then the steady ms a batched frame of each count: (wall of 250
frames - wall of 50) / 200, the median of 3.
--long: after those, one take of each of these frame counts, twice: the first long request after load (a request
past the attention windows the load captured, where frame graphs are per window). --root: the tree whose engine
runs (an A/B of two trees with this tree's bench code).
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

from engine_probe import request_wall_s
from gpu_bench import checkpoint
from timing import gpu_tag


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--takes", type=int, nargs="+", default=[2, 3, 4, 8, 16])
    ap.add_argument("--warm-takes", type=int, default=1)
    ap.add_argument("--long", type=int, nargs="*", default=[], help="frame counts of one-take long requests")
    ap.add_argument("--root", type=Path, help="the tree whose engine runs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.root:  # the engine of another tree, imported below (this tree's bench modules stay)
        sys.path.insert(0, str(args.root))
    from engine import Engine

    t0 = time.perf_counter()
    warm = {"warm_takes": args.warm_takes} if args.warm_takes > 1 else {}  # a tree before warm_takes runs without
    eng = Engine.load(checkpoint(args.size), device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", **warm)
    load_s = time.perf_counter() - t0
    runner, codec = eng.runner, eng.codec_graphs
    rows = []
    for takes in args.takes:
        frame_s, codec_s = runner.capture_seconds, codec.capture_seconds
        reserved = torch.cuda.memory_reserved()
        first = request_wall_s(eng, takes, 20)
        again = request_wall_s(eng, takes, 20)
        rows.append({"takes": takes, "first_ms": 1000 * first, "again_ms": 1000 * again,
                     "frame_capture_s": runner.capture_seconds - frame_s,
                     "codec_capture_s": codec.capture_seconds - codec_s,
                     "reserved_gb": (torch.cuda.memory_reserved() - reserved) / 1e9})
        print(rows[-1], file=sys.stderr, flush=True)
    long_rows = []
    for frames in args.long:
        frame_s, late = runner.capture_seconds, runner.late_captures
        first = request_wall_s(eng, 1, frames)
        again = request_wall_s(eng, 1, frames)
        long_rows.append({"frames": frames, "first_ms": 1000 * first, "again_ms": 1000 * again,
                          "frame_capture_s": runner.capture_seconds - frame_s,
                          "late_captures": runner.late_captures - late})
        print(long_rows[-1], file=sys.stderr, flush=True)
    steady = {}
    for takes in [1, *args.takes]:
        spans = [request_wall_s(eng, takes, 250) - request_wall_s(eng, takes, 50) for _ in range(3)]
        steady[takes] = 1000 * statistics.median(spans) / 200
        print(f"steady {takes} takes: {steady[takes]:.3f} ms a frame", file=sys.stderr, flush=True)
    out = {"device": gpu_tag(), "size": args.size, "warm_takes": args.warm_takes, "load_s": load_s,
           "notes": eng.info.notes, "first_use": rows, "long": long_rows, "root": str(args.root or ROOT),
           "steady_ms_per_frame": steady}
    lines = ["| takes | first request ms | again ms | frame capture s | codec capture s | reserved GB "
             "| steady ms a frame |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['takes']} | {r['first_ms']:.0f} | {r['again_ms']:.0f} | {r['frame_capture_s']:.2f} | "
                     f"{r['codec_capture_s']:.2f} | {r['reserved_gb']:.2f} | {steady[r['takes']]:.3f} |")
    if long_rows:
        lines += ["", "| one take, frames | first request ms | again ms | frame capture s | captures during it |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['frames']} | {r['first_ms']:.0f} | {r['again_ms']:.0f} | {r['frame_capture_s']:.2f} | "
                  f"{r['late_captures']} |" for r in long_rows]
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({"load_s": load_s, "steady": steady}))


if __name__ == "__main__":
    main()
