"""Programmatic dependent launch (engine/kernels/pdl.py) on and off, same GPU, same run.

    python bench/pdl_bench.py --out DIR [--sizes 0.6b 1.7b] [--frames 250] [--takes 1 16]

Each (size, PDL) pair runs in its own fresh process (QWEN3TTS_PDL=0 or 1) on a real-size random
CustomVoice checkpoint (EOS disabled): decode ms per frame of whole 250-frame requests (best of 3) at
each take count, the whole-frame graph replayed 200 times, the kernels of one frame, and the codes of
a fixed-seed sampled run. PDL changes only when kernels start, never what they compute, so the codes
of the two processes must be identical. Writes DIR/pdl.json and DIR/pdl.md.
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


def worker(ckpt: Path, frames: int, takes_list, codes_path: Path) -> dict:
    from gpu_bench import TEXT
    from profile_frame import frame_ms, kernel_table
    from timing import best_of

    from engine import Engine, Request

    t = time.perf_counter()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", max_seq_len=1024)
    out = {"load_s": time.perf_counter() - t, "notes": eng.info.notes, "takes": {}}
    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=frames)
    codes = {}
    for takes in takes_list:
        res = eng.generate(req, takes=takes, seed=7, params=params)  # captures this bucket
        codes[takes] = torch.stack([c for c in res.codes])

        def timed(rep, takes=takes):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = eng.generate(req, takes=takes, seed=rep, params=params)
            wall = time.perf_counter() - t0
            st = r.stats
            return {"decode_ms_per_frame": 1000 * (st["decode_s"] - st["prefill_s"]) / frames,
                    "e2e_ms_per_frame": 1000 * wall / frames}

        row = best_of(timed, key=lambda r: r["decode_ms_per_frame"])
        row["graph_ms_per_frame"] = frame_ms(eng.runner)  # the last bucket's state, replayed
        out["takes"][str(takes)] = row
        print(json.dumps({"takes": takes, **row}), file=sys.stderr, flush=True)
    eng.generate(req, takes=1, seed=7, params=params.replace(max_new_tokens=16))  # frame state of bucket 1
    out["kernels_per_frame"] = sum(r["count"] for r in kernel_table(eng))
    torch.save(codes, codes_path)
    return out


def run_worker(ckpt: Path, codes: Path, frames: int, takes, env: dict) -> dict:
    """worker() in a fresh process with `env` added; its result, or {"error": ...}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(ckpt), "--codes", str(codes),
           "--frames", str(frames), "--takes", *map(str, takes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False, env={**os.environ, **env})
    sys.stderr.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def take_codes(paths) -> list | None:
    """The saved codes of each variant (the files are removed), or None if a worker failed."""
    if not all(p.exists() for p in paths):
        return None
    codes = [torch.load(p, weights_only=True) for p in paths]
    for p in paths:
        p.unlink()
    return codes


def write_report(out: Path, name: str, column: str, results: dict, frames: int) -> None:
    """out/name.json and out/name.md: a row per (size, variant, takes); results keys are "size variant"
    (the variant shown after its last "="), other entries (codes checks, errors) listed below."""
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "frames": frames,
            "date": time.strftime("%Y-%m-%d")}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [(f"{meta['gpu']}, torch {meta['torch']}, bf16, {frames}-frame requests (EOS disabled), best of 3; "
              "each row a fresh process."), "",
             f"| model | {column} | takes | decode ms/frame | e2e ms/frame | graph replay ms/frame | kernels/frame | load s |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        if "takes" not in r:
            continue
        size, variant = key.split(" ")
        for takes, row in r["takes"].items():
            lines.append(f"| {size} | {variant.split('=')[-1]} | {takes} | {row['decode_ms_per_frame']:.3f} | "
                         f"{row['e2e_ms_per_frame']:.3f} | {row['graph_ms_per_frame']:.3f} | "
                         f"{r['kernels_per_frame']} | {r['load_s']:.2f} |")
    lines += [f"\n{key}: {r}" for key, r in results.items() if "takes" not in r]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=Path)
    ap.add_argument("--codes", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 16])
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.frames, args.takes, args.codes)))
        return
    from gpu_bench import checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for size in args.sizes:
        ckpt = checkpoint(size)
        paths = []
        for pdl in ("0", "1"):
            paths.append(args.out / f"codes_{size}_pdl{pdl}.pt")
            results[f"{size} pdl={pdl}"] = run_worker(ckpt, paths[-1], args.frames, args.takes, {"QWEN3TTS_PDL": pdl})
        codes = take_codes(paths)
        if codes is not None:
            a, b = codes
            results[f"{size} codes identical"] = {str(k): bool(torch.equal(a[k], b[k])) for k in a}
    write_report(args.out, "pdl", "PDL", results, args.frames)


if __name__ == "__main__":
    main()
