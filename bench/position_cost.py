"""What a frame costs at each cache position: the captured frame graphs replayed at chosen positions.

    python bench/position_cost.py [--size 0.6b] [--takes 1 4] [--attention '{"PROGRAMS_PER_SM": 2}'] [--shared 0 300]
                                  [--positions 40 500 ...] [--root TREE] [--label L] [--out F.json]

A request's frames run at positions prompt length .. prompt length + frames, in the graph of each position
(engine/gpu/frame_graph.py: one graph a bucket with the Triton attention, which reads each row's length on the
device; one a window bucket with the torch attention, or in trees before that). The real-length benchmark's
request overhead counts every frame at the steady ms/frame of a short request, so frames at late positions
show up there as overhead. This bench loads the engine as the node does (random real-size CustomVoice
checkpoint), runs one short request per takes count so its graphs exist, then for each position replays its
graph 16 times from there (each replay advances it by one) and reports the GPU ms a frame (CUDA events, the
best of 3). A graph a position needs that the load did not capture is captured first, outside the timing.
--positions: those positions; without it, a few in each window bucket the load captured. --root: the tree
whose engine runs (an A/B of two trees with this tree's bench code). --attention patches
engine.kernels.attention.CONFIG before the load (a launch-plan A/B).
--shared: for each length N, every row reads the positions below N (at most its position) from row 0's copy,
as the takes of one N-token prompt do (FrameState.share); 0 = each row its own copy, as before.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_probe import load_captured, seat
from timing import best_of, mean_gpu_ms

REPLAYS = 16


def positions(window: int, step: int) -> list:
    """A few starting positions inside the bucket (window - step, window], each leaving room for the replays."""
    lo = window - step
    return [p for p in (lo + 8, lo + step // 2, window - REPLAYS) if p >= 0]


@torch.inference_mode()
def frame_ms(runner, batch: int, window: int, pos: int, shared: int = 0) -> float:
    """GPU ms a frame of the (batch, window) graph replayed REPLAYS times from position pos (best of 3)."""
    def once(_):
        s = seat(runner, batch, pos)
        s.share[0].copy_(torch.zeros_like(s.rows) if shared else s.rows)
        s.share[1].fill_(min(shared, pos))
        return mean_gpu_ms(runner._graph(window).replay, REPLAYS, warm=False)  # the seated batch's graph

    return best_of(once)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--attention", default="", help="JSON: entries of engine.kernels.attention.CONFIG to override")
    ap.add_argument("--shared", type=int, nargs="+", default=[0], help="shared prompt lengths to measure")
    ap.add_argument("--positions", type=int, nargs="+", help="cache positions to time (default: per window)")
    ap.add_argument("--root", type=Path, help="the tree whose engine runs")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.root:  # the engine of another tree, imported below (this tree's bench modules stay)
        sys.path.insert(0, str(args.root))

    from engine.gpu.buckets import batch_bucket
    from engine.gpu.frame_graph import WINDOW_STEP
    from engine.kernels import attention

    if args.attention:
        attention.CONFIG.update(json.loads(args.attention))
    eng = load_captured(args.size, args.takes)
    rows = []
    for takes in args.takes:
        batch = batch_bucket(takes)
        if args.positions:
            at = [(eng.runner._window(p), p) for p in args.positions]
        else:
            windows = sorted(w for b, w in eng.runner.graphs if b == batch and w is not None)
            if not windows:  # one graph for every position: the positions of main's windows up to the room
                windows = list(range(WINDOW_STEP, eng.runner.max_seq_len + 1, WINDOW_STEP))
            at = [(eng.runner._window(p), p) for w in windows for p in positions(w, WINDOW_STEP)]
        for window, pos in at:
            for shared in args.shared:
                ms = frame_ms(eng.runner, batch, window, pos, shared)
                rows.append({"takes": takes, "window": window, "pos": pos, "shared": shared, "ms": ms})
                print(f"{args.label} takes {takes} window {window} pos {pos:4d} shared {shared:4d}: "
                      f"{ms:.4f} ms a frame", flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "size": args.size, "label": args.label,
           "root": str(args.root or ROOT), "frame_graphs_after": len(eng.runner.graphs),
           "attention_config": attention.CONFIG, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
