"""Where a long streamed request's time goes on the GPU: the frames' stream, busy and idle, against the codec's
work on the side streams.

    python bench/stream_timeline.py [--size 0.6b] [--frames 356] [--out FILE.json]

Loads the real-size random CustomVoice checkpoint with the node's defaults and runs one request of `--frames`
frames (the real-length script's longest is 356) in three ways:
  * `generate`, one take: the codec runs beside the frames in 16-frame pieces (OverlappedDecode);
  * `stream_batch` as the Stream node runs it: chunks of 8 frames, the first of 2;
  * `stream_batch` in chunks of 16, the first of 2.
Each is run once to warm up and once under torch.profiler (CUDA activity). From the trace's kernels it reports:
the wall time; the main stream's busy time (the union of its kernels) and idle time within the request; the side
streams' busy time and how much of it ran while the main stream was busy. The main stream is the one with the
most kernels (the frame graphs'). If the streamed request's extra wall time against `generate` shows up as main
stream busy time, the frames' kernels ran slower beside the codec; if as idle time, the frames waited (host or
hand-over).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_probe import script_params  # noqa: E402
from gpu_bench import checkpoint  # noqa: E402

TEXT = ("A long line, as a user pastes a paragraph into the Stream node and listens while the rest is still being "
        "spoken, sentence after sentence, without a pause between them.")


def union(intervals: list) -> list:
    """Sorted, merged [start, end) intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def length(intervals: list) -> float:
    return sum(end - start for start, end in intervals)


def overlap(a: list, b: list) -> float:
    """Time covered by both unions a and b."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def kernel_streams(trace_path: str) -> dict:
    """{stream id: [(start us, end us)]} of the trace's GPU kernels."""
    events = json.load(open(trace_path))["traceEvents"]
    streams: dict = {}
    for e in events:
        if e.get("cat") == "kernel" and "dur" in e:
            sid = e.get("args", {}).get("stream", e.get("tid"))
            streams.setdefault(sid, []).append((e["ts"], e["ts"] + e["dur"]))
    return streams


def summarize(streams: dict, frames: int) -> dict:
    main = max(streams, key=lambda s: len(streams[s]))
    main_busy = union(streams[main])
    side = union([iv for s, ivs in streams.items() if s != main for iv in ivs])
    start = min(iv[0] for ivs in streams.values() for iv in ivs)
    end = max(iv[1] for ivs in streams.values() for iv in ivs)
    return {"gpu_window_ms": (end - start) / 1e3, "main_kernels": len(streams[main]),
            "main_busy_ms": length(main_busy) / 1e3, "main_idle_ms": (end - start - length(main_busy)) / 1e3,
            "main_busy_ms_per_frame": length(main_busy) / 1e3 / frames,
            "side_busy_ms": length(side) / 1e3, "side_beside_main_ms": overlap(main_busy, side) / 1e3,
            "side_streams": len(streams) - 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--frames", type=int, default=356)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from engine import BatchItem, Engine, Request

    eng = Engine.load(checkpoint(args.size), device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    req = Request(mode="custom", text=TEXT, language="English", speaker=eng.speakers[0])
    params = script_params(eng, args.frames)

    def generate():
        return eng.generate(req, params=params).stats["frames"]

    def streamed(chunk):
        def run():
            n = 0
            for c in eng.stream([BatchItem(req, takes=1)], params=params, chunk_frames=chunk,
                                      first_chunk_frames=2):
                n += c.codes.shape[0]
            return n
        return run

    ways = {"generate, 1 take": generate, "stream_batch, chunk 8 (first 2)": streamed(8),
            "stream_batch, chunk 16 (first 2)": streamed(16)}
    results = {}
    for name, run in ways.items():
        assert run() == args.frames  # warm: any first-use cost is paid here
        torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                t = time.perf_counter()
                run()
                torch.cuda.synchronize()
                wall = time.perf_counter() - t
            prof.export_chrome_trace(f.name)
            results[name] = {"wall_ms": 1e3 * wall, **summarize(kernel_streams(f.name), args.frames)}
    print(f"\n{torch.cuda.get_device_name(0)}, {args.size}, one request of {args.frames} frames (profiled, so slower "
          "than unprofiled)\n")
    print("| way | wall ms | main stream busy ms (per frame) | main idle ms | side busy ms | side beside main ms |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['wall_ms']:.1f} | {r['main_busy_ms']:.1f} ({r['main_busy_ms_per_frame']:.3f}) | "
              f"{r['main_idle_ms']:.1f} | {r['side_busy_ms']:.1f} | {r['side_beside_main_ms']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "frames": args.frames,
                                        "results": results}, indent=2))


if __name__ == "__main__":
    main()
