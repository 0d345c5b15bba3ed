"""Where an engine load's seconds go: each load in a fresh process, the steps timed and the host profiled.

    python bench/load_profile.py --out DIR [--size 0.6b] [--loads 3]

The first load of a fresh machine compiles the Triton kernels (a cold cache); the later ones find them in
the cache, as a ComfyUI user's second start does. Each load reports its wall time, the engine's own step
timings (weights, frame graphs, prefill graphs, codec pieces each split into warm-up run and capture) and,
for the last load, the host functions that took the most time (cProfile, own time and cumulative).
Writes DIR/load_profile_<gpu>.json.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

from gpu_bench import checkpoint
from load_trace import wrap_calls
from timing import gpu_tag, run_fresh

ROOT = Path(__file__).resolve().parents[1]


def worker(ckpt: Path, profile: bool) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    import engine.gpu.capture as capture_mod
    from engine import Engine
    from engine.gpu import codec_graph

    steps = []
    real_capture = capture_mod.capture

    def sync():  # this thread's stream only: a device-wide sync would break the codec thread's capture beside it
        torch.cuda.current_stream().synchronize()

    def timed_capture(body, pool=None, warmups: int = 1):  # split each capture into warm-up and capture
        def timed_body():
            if torch.cuda.is_current_stream_capturing():  # no sync inside a capture
                return body()
            sync()
            t = time.perf_counter()
            out = body()
            sync()
            timed_body.seconds.append(time.perf_counter() - t)
            return out

        timed_body.seconds = []
        t = time.perf_counter()
        out = real_capture(timed_body, pool, warmups)
        sync()
        total = time.perf_counter() - t
        steps.append({"what": timed_capture.label, "total_s": total, "warmup_s": sum(timed_body.seconds)})
        return out

    timed_capture.label = "frame or prefill graph"
    real_codec_capture = codec_graph.CodecGraphs.capture

    def codec_capture(self, bucket, frames):
        timed_capture.label = f"codec piece {frames} frames x {bucket} rows"
        try:
            return real_codec_capture(self, bucket, frames)
        finally:
            timed_capture.label = "frame or prefill graph"

    capture_mod.capture = timed_capture
    codec_graph.capture_graph = timed_capture
    from engine.gpu import frame_graph, prefill_graph

    for mod in (frame_graph, prefill_graph):
        for name in dir(mod):
            if getattr(mod, name) is real_capture:
                setattr(mod, name, timed_capture)
    codec_graph.CodecGraphs.capture = codec_capture

    from engine.checkpoint import loader
    from engine.engine import Engine as EngineClass

    def timed(owner, name, label):  # whole steps, nested ones included in their parent's time
        wrap_calls(owner, name, lambda a, start, end: phases.append({"what": label, "s": end - start}), sync=sync)

    phases = []
    timed(loader, "load_components", "weights (load_components)")
    timed(EngineClass, "_warmup", "warm-up request + precapture (_warmup)")
    timed(frame_graph.GraphedFrames, "precapture", "frame windows + prefill buckets (GraphedFrames.precapture)")
    timed(codec_graph.CodecGraphs, "precapture", "codec pieces (CodecGraphs.precapture)")
    timed(codec_graph.CodecGraphs, "state", "codec state (its first call decodes a frame eagerly)")

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    sync()
    if prof:
        prof.disable()
    load_s = time.perf_counter() - t
    out = {"load_s": load_s, "notes": eng.info.notes, "steps": steps, "phases": phases}
    if prof:
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
            out[f"top_{key}"] = buf.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.ckpt, args.profile)))
        return
    import torch

    gpu = torch.cuda.get_device_name(0)
    ckpt = checkpoint(args.size)
    loads = []
    for i in range(args.loads):
        r = run_fresh(__file__, ["--worker", "--ckpt", str(ckpt)] + (["--profile"] if i == args.loads - 1 else []))
        if "error" in r:
            raise SystemExit(r["error"])
        loads.append(r)
        by = {}
        for s in r["steps"]:
            kind = s["what"].split(" x ")[0] if s["what"].startswith("codec") else s["what"]
            agg = by.setdefault(kind, [0, 0.0, 0.0])
            agg[0] += 1
            agg[1] += s["warmup_s"]
            agg[2] += s["total_s"]
        print(f"load {i}: {r['load_s']:.2f} s", flush=True)
        for p in r["phases"]:
            print(f"   {p['what']:60s} {p['s']:.3f} s")
        for kind, (n, warm, total) in by.items():
            print(f"   {kind:32s} {n:3d} captures  warm-up {warm:.3f} s  total {total:.3f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    name = gpu_tag()
    (args.out / f"load_profile_{args.size}_{name}.json").write_text(json.dumps({"gpu": gpu, "loads": loads}, indent=2))
    print(loads[-1].get("top_tottime", "")[:6000])
    print(loads[-1].get("top_cumulative", "")[:6000])


if __name__ == "__main__":
    main()
