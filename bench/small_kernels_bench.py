"""The sampling kernel in CUDA graphs of back-to-back launches (PDL as the engine runs it), at each warp
count, with its embedding-row output (as the frame graph calls it).

    python bench/small_kernels_bench.py --out DIR

Writes DIR/small_kernels.json and prints microseconds per launch (kernel_bench.graph_time_us: the median
of 20 replays of a graph of 50 launches; the committed small_kernels_h200*.json took the best of 5).
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

from kernel_bench import graph_time_us  # bench/ is on the path from here

# (vocabulary, rows, logits dtype, top_p): the residual codebooks' bf16 logits (16-bit keys), at 1 and 16 rows;
# float32 logits at the talker's 3072 (32-bit keys, as codebook 0 after its penalty); and a top-p cut.
CASES = ((2048, 1, torch.bfloat16, 1.0), (3072, 1, torch.bfloat16, 1.0), (2048, 16, torch.bfloat16, 1.0),
         (3072, 1, torch.float32, 1.0), (2048, 1, torch.bfloat16, 0.8))


def sampling_rows(pdl: bool, warp_counts=(1, 2, 4, 8, 16)) -> list:
    from engine import sampling
    from engine.gpu import graph_sampling
    from engine.kernels import sample as k

    rows = []
    dev = "cuda"
    for vocab, b, dtype, top_p in CASES:
        logits = torch.randn(b, vocab, device=dev).to(dtype)
        f32 = {"device": dev, "dtype": torch.float32}
        settings = (torch.tensor(True, device=dev), torch.tensor(0.9, **f32),
                    torch.tensor(graph_sampling.kth_index(50, vocab), device=dev), torch.tensor(top_p, **f32))
        draw = {"keys": sampling.take_keys(0, range(b), dev), "step": torch.tensor([3], device=dev), "slot": 2}
        table = torch.randn(vocab, 1024, device=dev).to(torch.bfloat16)
        want = k.sample(logits, *settings, **draw, embed=table, pdl=pdl)
        for warps in warp_counts:
            got = k.sample(logits, *settings, **draw, embed=table, pdl=pdl, warps=warps)
            same = all(torch.equal(x, y) for x, y in zip(got, want))
            us = graph_time_us(lambda w=warps, x=logits, s=settings, d=draw, t=table:
                               k.sample(x, *s, **d, embed=t, pdl=pdl, warps=w))
            rows.append({"kernel": "sample", "vocab": vocab, "rows": b, "dtype": str(dtype).split(".")[-1],
                         "top_p": top_p, "warps": warps, "us": round(us, 2), "same_ids": same})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = ap.parse_args()
    from engine.kernels import pdl as kpdl

    pdl = kpdl.support("cuda")[0]
    result = {"gpu": torch.cuda.get_device_name(), "pdl": pdl, "sample": sampling_rows(pdl, args.warps)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "small_kernels.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
