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
import sys
from pathlib import Path

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
    from pdl_bench import run_worker, take_codes, write_report

    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for size in args.sizes:
        ckpt = checkpoint(size)
        paths = []
        for choice in CHOICES:
            paths.append(args.out / f"codes_{size}_{choice}.pt")
            results[f"{size} {choice}"] = run_worker(ckpt, paths[-1], args.frames, args.takes,
                                                     {"QWEN3TTS_TALKER_ATTENTION": choice})
        codes = take_codes(paths)
        if codes is not None:
            a, b = codes
            results[f"{size} identical frames"] = {
                str(k): round(float((a[k] == b[k]).all(-1).float().mean()), 4) if a[k].shape == b[k].shape
                else f"shapes {tuple(a[k].shape)} / {tuple(b[k].shape)}" for k in a}
    write_report(args.out, "talker_attention", "talker attention", results, args.frames)


if __name__ == "__main__":
    main()
