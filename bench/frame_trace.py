"""What each kernel of a decode frame adds to the frame's time, from one replay of the captured frame graph.

    python bench/frame_trace.py --out DIR [--size 0.6b] [--takes 1]

bench/profile_frame.py sums each kernel's own duration; under programmatic dependent launch those overlap (a
kernel starts, loads its weights and waits while the previous one runs), so the sums say little about the
frame. Here the frame graph is replayed under the CUDA profiler and each kernel is charged the time from the
previous kernel's end to its own end: what the frame would lose without it. The charges add up to the frame.
Kernels are grouped by name (torch's own kernels as one group). Writes DIR/frame_trace_<size>_b<takes>.json.gz
with every kernel of the frame in order and prints the table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from profile_frame import current_window, frame_ms
from timing import write_json

OURS = ("linear_kernel", "attention_o_proj_kernel", "split_kernel", "qk_norm_rope_kv_kernel", "sample_kernel",
        "rms_norm_kernel", "attention_kernel", "talker_input_kernel",
        "frame_tail_kernel")


def frame_kernels(runner, replays: int = 3) -> list:
    """[(name, start us, end us)] of the middle one of `replays` profiled replays of the runner's frame graph."""
    from torch.profiler import ProfilerActivity, profile

    s = runner.s
    saved = s.snapshot()
    graph = runner._graph(current_window(runner))
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    s.restore(saved)
    events = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e[1])
    n = len(events) // replays
    return events[n * (replays // 2): n * (replays // 2 + 1)]


def charges(kernels: list) -> list:
    """[{kernel, count, us, us_each}] by summed charge: each kernel's end minus the previous kernel's end."""
    groups = {}
    prev = kernels[0][1]
    for name, _, end in kernels:
        key = next((k for k in OURS if k in name), "torch and copies")
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += end - prev
        prev = end
    rows = [{"kernel": k, "count": c, "us": round(us, 1), "us_each": round(us / c, 2)} for k, (c, us) in groups.items()]
    return sorted(rows, key=lambda r: -r["us"])


@torch.inference_mode()  # the engine's state tensors are inference tensors
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--takes", type=int, default=1)
    args = ap.parse_args()
    from gpu_bench import TEXT, checkpoint

    from engine import Engine, Request

    eng = Engine.load(checkpoint(args.size), device="cuda", dtype="bf16", cuda_graphs="on", triton="auto",
                      max_seq_len=1024)
    eng.generate(Request(mode="custom", text=TEXT, language="English", speaker="ryan"), takes=args.takes, seed=0,
                 params=eng.defaults.replace(max_new_tokens=64))
    ms = frame_ms(eng.runner)
    kernels = frame_kernels(eng.runner)
    rows = charges(kernels)
    span = kernels[-1][2] - kernels[0][1]
    print(f"{args.size} B={args.takes}: frame graph {ms:.3f} ms, {len(kernels)} kernels, traced {span:.0f} us")
    print("| kernel | count | us charged | us each |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['count']} | {r['us']} | {r['us_each']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"frame_trace_{args.size}_b{args.takes}.json.gz",
               {"device": torch.cuda.get_device_name(), "size": args.size, "takes": args.takes, "graph_ms": ms,
                "traced_us": span, "charges": rows, "kernels": kernels})


if __name__ == "__main__":
    main()
