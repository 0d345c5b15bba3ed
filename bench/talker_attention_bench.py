"""The talker's attention as torch's four ops against the Triton split-KV kernel, whole requests, same GPU,
same run (engine/gpu/frame_graph.py TALKER_TRITON_ATTENTION; here switched by QWEN3TTS_TALKER_ATTENTION).

    python bench/talker_attention_bench.py --out DIR [--sizes 0.6b 1.7b] [--frames 250] [--takes 1 16]

Each (size, attention) pair runs in its own fresh process with bench/pdl_bench.py's worker (random real-size
CustomVoice checkpoint, EOS disabled, kernels "auto" so PDL as the engine picks it): decode ms per frame of
whole requests (best of 3), the frame graph replayed, kernels per frame, and the codes of a fixed-seed run.
The two attentions round differently (the kernel keeps fp32 probabilities), so the codes may drift apart
after a while: the share of identical frames is reported, not required. --frames 900 reaches the
1024-position window (the worker's max_seq_len). Writes DIR/talker_attention.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CHOICES = ("torch", "triton")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 16])
    args = ap.parse_args()
    from gpu_bench import checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for size in args.sizes:
        ckpt = checkpoint(size)
        for choice in CHOICES:
            codes = args.out / f"codes_{size}_{choice}.pt"
            cmd = [sys.executable, str(ROOT / "bench" / "pdl_bench.py"), "--worker", str(ckpt), "--codes", str(codes),
                   "--frames", str(args.frames), "--takes", *map(str, args.takes)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False,
                                  env={**os.environ, "QWEN3TTS_TALKER_ATTENTION": choice})
            sys.stderr.write(proc.stderr[-3000:])
            if proc.returncode != 0:
                results[f"{size} {choice}"] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            results[f"{size} {choice}"] = json.loads(proc.stdout.strip().splitlines()[-1])
        pair = [args.out / f"codes_{size}_{c}.pt" for c in CHOICES]
        if all(p.exists() for p in pair):
            a, b = (torch.load(p, weights_only=True) for p in pair)
            results[f"{size} identical frames"] = {
                str(k): round(float((a[k] == b[k]).all(-1).float().mean()), 4) if a[k].shape == b[k].shape
                else f"shapes {tuple(a[k].shape)} / {tuple(b[k].shape)}" for k in a}
            for p in pair:
                p.unlink()
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "frames": args.frames,
            "date": time.strftime("%Y-%m-%d")}
    (args.out / "talker_attention.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [(f"{meta['gpu']}, torch {meta['torch']}, bf16, {args.frames}-frame requests (EOS disabled), best of 3; "
              "each row a fresh process."), "",
             ("| model | talker attention | takes | decode ms/frame | e2e ms/frame | graph replay ms/frame | "
              "kernels/frame | load s |"), "|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        if "takes" not in r:
            continue
        size, choice = key.split(" ")
        for takes, row in r["takes"].items():
            lines.append(f"| {size} | {choice} | {takes} | {row['decode_ms_per_frame']:.3f} | "
                         f"{row['e2e_ms_per_frame']:.3f} | {row['graph_ms_per_frame']:.3f} | "
                         f"{r['kernels_per_frame']} | {r['load_s']:.2f} |")
    for key, r in results.items():
        if "identical" in key or "error" in r:
            lines.append(f"\n{key}: {r}")
    (args.out / "talker_attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
