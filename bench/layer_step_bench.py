"""One decode layer step (FusedLayer.step: qkv, q/k norm + RoPE + cache write, attention, o_proj, MLP) at the
real sizes, with q/k norm + RoPE fused into attention (kernel "rope_attention") or as its own launch.

    python bench/layer_step_bench.py --out DIR

Random layers of the 0.6B shapes (hidden 1024, MLP 3072, 16 heads of 128, 8 kv heads), in a CUDA graph
of 64 steps through 8 layers (as consecutive layers run in a frame), with PDL as the engine launches them.
Windows 16 (the code predictor) and 256 / 768 (the talker's buckets); rows 1, 4 and 16. Per variant:
us a layer step, best of 5 replays of the graph. FUSED_ONE_WARPS varies the warps of the one-program attention
(windows under 128). Writes DIR/layer_step_<gpu>.json. (The committed layer_step_h100.json also has
"fused_splice_us": the new k / v rows spliced in from registers, a variant dropped after this measurement.)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from timing import gpu_tag

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = 64
LAYERS = 8


def time_steps(fs, ks, rows: int, window: int) -> float:
    from engine.kernels import selftest as st

    dev, dt = "cuda", torch.bfloat16
    fl = fs.layers
    caches = [(torch.randn(rows, 8, window, 128, device=dev, dtype=dt),
               torch.randn(rows, 8, window, 128, device=dev, dtype=dt)) for _ in fl]
    x = torch.randn(rows, 1, 1024, device=dev, dtype=dt)
    pos = torch.tensor([window - 3], device=dev)
    cos, sin = st.rope_tables(128, window - 3, dt, dev)
    bias = torch.where(torch.arange(window) < window - 2, 0.0, float("-inf")).to(dt).to(dev)

    def body():
        h = x
        for i in range(STEPS):
            layer = fl[i % len(fl)]
            h = layer.step(ks, h, cos, sin, *caches[i % len(fl)], pos, bias)
        return h

    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / STEPS)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    from engine import kernels
    from engine.kernels import attention
    from engine.kernels import selftest as st

    fs = st.predictor_stack("cuda", torch.bfloat16, hidden=1024, inter=3072, layers=LAYERS, nh=16, nkv=8, d=128)
    attention.FUSE_MIN_ROWS = 1  # measure the fused launch at every row count (the engine fuses from 4 rows)
    fused = kernels.Kernels(kernels.NAMES, pdl=True)
    split = fused.without("rope_attention")
    gpu = torch.cuda.get_device_name(0)
    rows_out = []
    for window in (16, 256, 768):
        for rows in (1, 4, 16):
            row = {"window": window, "rows": rows, "two_launches_us": time_steps(fs, split, rows, window)}
            for warps in ((1, 2, 4) if window < attention.SPLIT_MIN_WINDOW else (4,)):
                attention.CONFIG["FUSED_ONE_WARPS"] = warps
                row[f"fused_w{warps}_us"] = time_steps(fs, fused, rows, window)
            attention.CONFIG["FUSED_ONE_WARPS"] = 2
            rows_out.append(row)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = gpu_tag()
    (args.out / f"layer_step_{name}.json").write_text(json.dumps({"gpu": gpu, "rows": rows_out}, indent=2))


if __name__ == "__main__":
    main()
