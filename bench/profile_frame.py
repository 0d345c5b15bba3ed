"""Where a decode frame spends its GPU time: per-kernel totals of one frame, and GEMV bandwidth.

    python bench/profile_frame.py --out DIR [--size 0.6b] [--takes 1] [--triton auto] [--batch-invariant]
        [--cublas-from-rows N]    # --takes 64: a server's rows

Loads a real-size random CustomVoice checkpoint (built like bench/gpu_bench.py), decodes a short request
to capture the graphs, then
  * replays the whole-frame graph 200 times and reports ms per frame;
  * profiles the same frame body eagerly (CUDA activity only) and groups kernels by name: count per
    frame, summed device microseconds, share of the frame; the difference between the graph's wall time
    and the summed kernel time is launch latency and gaps;
  * times torch's linear at the decode shapes with weights rotated through more memory than L2 holds,
    so the figure is HBM bandwidth, not cache.
Writes DIR/profile_<size>_b<takes>_<triton>[_invariant][_cublasN].json and prints the tables.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import cuda_kernels, mean_gpu_ms, write_json


def current_window(runner):
    """The attention window of the runner's current bucket at its longest row's position (its graph's key)."""
    return runner._window(int(runner.s.pos.max()))


def frame_ms(runner, frames=200) -> float:
    s = runner.s
    saved = s.snapshot()
    graph = runner._graph(current_window(runner))
    ms = mean_gpu_ms(graph.replay, frames)
    s.restore(saved)
    return ms


@torch.inference_mode()  # the engine's state tensors are inference tensors
def kernel_table(eng) -> list:
    """One eager frame body under the profiler: [{kernel, count, us}] by summed device time (the graph
    replays exactly these launches)."""
    from engine.gpu.frame_graph import frame_body

    runner = eng.runner
    s = runner.s
    saved = s.snapshot()
    window = current_window(runner)
    rows = cuda_kernels(lambda: frame_body(eng.talker, runner.fused, s, window))
    s.restore(saved)
    return rows


def gemv_bandwidth(dtype, takes: int) -> list:
    shapes = [(4096, 1024), (6144, 1024), (1024, 3072), (1024, 2048), (2048, 1024), (3072, 1024),
              (4096, 2048), (12288, 2048), (2048, 6144), (2048, 2048)]
    out = []
    for n, k in shapes:
        copies = max(2, int(4 * 2 ** 30 // (n * k * 2) // 8))  # well past L2 but bounded
        copies = min(copies, 64)
        ws = [torch.randn(n, k, device="cuda", dtype=dtype) for _ in range(copies)]
        x = torch.randn(takes, k, device="cuda", dtype=dtype)
        for w in ws[:3]:
            torch.nn.functional.linear(x, w)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for w in ws:
                torch.nn.functional.linear(x, w)
        g.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(5):
            g.replay()
        b.record()
        b.synchronize()
        us = a.elapsed_time(b) * 1000 / (5 * copies)
        out.append({"N": n, "K": k, "M": takes, "us": round(us, 2),
                    "GBps": round(n * k * 2 / us / 1e3, 1)})
        del ws
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--takes", type=int, default=1, help="rows of the frame, up to 64 (past 16, several requests)")
    ap.add_argument("--triton", default="auto")
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--cublas-from-rows", type=int, default=0, help="override linear_plan.CUBLAS_FROM_ROWS (rows "
                                                                   "from which a linear's matmul runs on cuBLAS)")
    ap.add_argument("--batch-invariant", action="store_true", help="load with batch_invariant (launches planned as "
                                                                   "for 64 rows)")
    args = ap.parse_args()
    from gpu_bench import TEXT, checkpoint

    from engine import BatchItem, Engine, Request
    from engine.kernels import linear_plan
    from engine.limits import MAX_TAKES

    if args.cublas_from_rows:
        linear_plan.CUBLAS_FROM_ROWS = args.cublas_from_rows

    eng = Engine.load(checkpoint(args.size), device="cuda", dtype="bf16", cuda_graphs="on", triton=args.triton,
                      max_seq_len=1024, max_takes=args.takes, batch_invariant=args.batch_invariant)
    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    # A request holds at most MAX_TAKES takes: more rows (a server's 64) come as several requests in one batch.
    sizes = [min(MAX_TAKES, args.takes - i) for i in range(0, args.takes, MAX_TAKES)]
    eng.generate([BatchItem(req, takes=n, seed=k) for k, n in enumerate(sizes)],
                 params=eng.defaults.replace(max_new_tokens=args.frames))
    runner = eng.runner
    ms = frame_ms(runner)
    rows = kernel_table(eng)
    total_us = sum(r["us"] for r in rows)
    count = sum(r["count"] for r in rows)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "size": args.size,
              "takes": args.takes, "triton": args.triton, "batch_invariant": args.batch_invariant,
              "cublas_from_rows": linear_plan.CUBLAS_FROM_ROWS,
              "kernels": eng.info.kernels,
              "graph_ms_per_frame": round(ms, 3), "kernels_per_frame": count,
              "summed_kernel_us": round(total_us, 1), "by_kernel": rows,
              "gemv": gemv_bandwidth(torch.bfloat16, args.takes)}
    print(f"{args.size} B={args.takes} triton={args.triton} batch_invariant={args.batch_invariant} "
          f"cublas_from_rows={linear_plan.CUBLAS_FROM_ROWS}: "
          f"graph {ms:.3f} ms/frame, {count} kernels, "
          f"summed kernel time {total_us / 1000:.3f} ms")
    for r in rows[:45]:
        print(f"{r['count']:5d} {r['us']:9.1f} us {100 * r['us'] / total_us:5.1f}%  {r['kernel']}")
    for r in result["gemv"]:
        print(f"linear M={r['M']} N={r['N']} K={r['K']}: {r['us']} us, {r['GBps']} GB/s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = (f"profile_{args.size}_b{args.takes}_{args.triton}{'_invariant' if args.batch_invariant else ''}"
            f"{f'_cublas{args.cublas_from_rows}' if args.cublas_from_rows else ''}")
    write_json(out / f"{name}.json", result)


if __name__ == "__main__":
    main()
