"""Where a frame's time goes between the captured graph and a whole request: one step at a time.

    python bench/loop_overhead.py [--size 0.6b] [--takes 1] [--frames 200] [--out F.json]

Loads the engine as the node does (random real-size CustomVoice checkpoint), captures its graphs with one short
request, then times frames at cache positions 30 .. 30 + frames (inside the torch attention's first window of 256; the
Triton attention has one graph for every position), median of 3, ms a frame
(a batched frame of `takes` rows):
  * replay: the frame graph of `takes` rows replayed back to back (host clock, synchronised around the run);
  * sustained: the same for 5 x frames in a row (does the GPU slow down under a long run?);
  * clones: each replay followed by the two copies the decode loop makes of the frame's codes and flags;
  * sync4: clones, plus a host read of the finished flags every 4 frames (the decode loop's one sync a chunk);
  * generate / no_overlap: whole requests (Engine.generate, `takes` takes) of `frames` and of 50 frames, the slope
    between them (fixed costs cancel); no_overlap decodes the codec after the last frame instead of beside the
    frames.
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

from engine_probe import codec_after_frames, load_captured, request_wall_s, seat

START = 30


def timed(loop, frames: int) -> float:
    """Host-clock ms a frame of loop() (which launches `frames` frames), synchronised before and after."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    loop()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t) / frames


@torch.inference_mode()
def frame_loops(eng, frames: int, takes: int = 1) -> dict:
    runner = eng.runner
    s = seat(runner, takes, START)
    graph = runner._graph(runner._window(START))  # the graph a frame at START replays

    def reset():
        seat(runner, takes, START)

    def replay(n=frames):
        reset()
        for i in range(n):
            if i and i % frames == 0:
                reset()  # stream-ordered: stay inside the first window without a sync
            graph.replay()

    def clones(sync_every=0):
        reset()
        for i in range(frames):
            graph.replay()
            s.frame[:takes].clone()
            s.valid[:takes].clone()
            if sync_every and (i + 1) % sync_every == 0:
                s.finished[:takes].tolist()

    loops = {"replay": (replay, frames), "sustained": (lambda: replay(5 * frames), 5 * frames),
             "clones": (clones, frames), "sync4": (lambda: clones(4), frames)}
    out = {}
    for name, (loop, n) in loops.items():
        loop()  # warm
        out[name] = statistics.median(timed(loop, n) for _ in range(3))
    return out


def request_slope(eng, frames: int, takes: int = 1) -> float:
    """ms a frame of whole requests: the median wall at `frames` and at 50 frames, the slope between them."""
    def wall(n):
        return request_wall_s(eng, takes, n)

    wall(frames)
    hi = statistics.median(wall(frames) for _ in range(3))
    lo = statistics.median(wall(50) for _ in range(3))
    return 1000 * (hi - lo) / (frames - 50)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--takes", type=int, default=1)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    eng = load_captured(args.size, (args.takes,))
    res = frame_loops(eng, args.frames, args.takes)
    res["generate"] = request_slope(eng, args.frames, args.takes)
    with codec_after_frames():
        res["no_overlap"] = request_slope(eng, args.frames, args.takes)
    for name, ms in res.items():
        print(f"{name:12s} {ms:.4f} ms a frame", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "size": args.size,
                                        "takes": args.takes, "frames": args.frames, "ms_per_frame": res}, indent=1))


if __name__ == "__main__":
    main()
