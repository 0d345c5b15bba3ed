"""Does the frame speed drift over time inside one process, and is it the GPU or the request path?

    python bench/frame_drift.py [--size 0.6b] [--seconds 80] [--out F.json]

The real-length benchmark's overhead p95 moves with a ~2% drift of the frame speed inside one process
(bench/results/real_length_h100_take1_rounds.json). This loads the engine as the node does and, for about
`--seconds`, alternates two measurements: the one-take frame graph replayed 200 times back to back (CUDA
events: the GPU alone) and a whole 200-frame request (host wall: the request path, with the codec beside the
frames). If both series move together the drift is on the GPU; if only the requests move, it is the host or
the overlap. Also samples the SM clock, power and temperature (nvidia-smi) for each measurement.
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

from engine_probe import load_captured, seat  # noqa: E402
from gpu_bench import TEXT  # noqa: E402
from timing import GpuClocks, mean_gpu_ms  # noqa: E402

FRAMES = 200
START = 30  # cache position of the replays: inside the first window for all 200 (the torch attention's 256)


@torch.inference_mode()
def replay_ms(runner, graph) -> float:
    """GPU ms a frame of FRAMES back-to-back replays from cache position START."""
    seat(runner, 1, START)
    return mean_gpu_ms(graph.replay, FRAMES, warm=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--seconds", type=float, default=80)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from engine import Request

    eng = load_captured(args.size)
    runner = eng.runner
    seat(runner, 1, START)
    graph = runner._graph(runner._window(START))  # the graph a frame at START replays
    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=FRAMES, min_new_tokens=FRAMES)
    eng.generate(req, takes=1, seed=0, params=params)  # warm
    replay_ms(runner, graph)
    rows = []
    with GpuClocks() as clocks:
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < args.seconds:
            t0 = time.perf_counter()
            r = replay_ms(runner, graph)
            t1 = time.perf_counter()
            eng.generate(req, takes=1, seed=len(rows), params=params)
            t2 = time.perf_counter()
            rows.append({"t_s": t0 - t_start, "replay_ms_per_frame": r,
                         "request_ms_per_frame": 1000 * (t2 - t1) / FRAMES, "clocks": clocks.during(t0, t2)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "clocks"}), flush=True)
    rep = [r["replay_ms_per_frame"] for r in rows]
    reqs = [r["request_ms_per_frame"] for r in rows]
    summary = {"gpu": torch.cuda.get_device_name(0), "size": args.size, "rounds": len(rows),
               "replay_min_max": [min(rep), max(rep)], "replay_stdev": statistics.pstdev(rep),
               "request_min_max": [min(reqs), max(reqs)], "request_stdev": statistics.pstdev(reqs),
               "correlation": statistics.correlation(rep, reqs) if len(rows) > 2 else None}
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps({**summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
