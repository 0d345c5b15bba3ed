"""CUDA memory left behind by Engine.release(): what a ComfyUI user gets back when a model is unloaded.

    python bench/release_memory.py --out DIR [--sizes 0.6b] [--engine-roots ROOT ...]

For each engine root (a before/after pair), in a fresh process: load a real-size random checkpoint (bf16,
graphs and Triton kernels on, as the node loads it), run one request and one stream, release(), and report
the CUDA memory allocated and reserved before the load, while loaded and after the release (after
gc.collect, cuBLAS workspaces cleared and empty_cache). Writes DIR/release_memory_<gpu>.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

from gpu_bench import checkpoint
from timing import gpu_tag, run_fresh

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _mem(clear: bool) -> dict:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    if clear:
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    return {"allocated_mib": torch.cuda.memory_allocated() / MIB, "reserved_mib": torch.cuda.memory_reserved() / MIB}


def worker(ckpt: Path, engine_root: Path) -> dict:
    import torch

    sys.path.insert(0, str(engine_root))
    from engine import Engine, Request

    torch.zeros(1, device="cuda")
    before = _mem(True)
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    req = Request(mode="custom", text="What is left after a release?", language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=40, min_new_tokens=min(eng.defaults.min_new_tokens, 40))
    eng.generate(req, params=params)
    for _ in eng.stream(req, params=params, chunk_frames=2):
        pass
    loaded = _mem(False)
    eng.release()  # the engine object stays referenced, as in ComfyUI's node cache
    after = _mem(True)
    left = after["allocated_mib"] - before["allocated_mib"]
    return {"engine_root": str(engine_root), "before": before, "loaded": loaded, "after_release": after,
            "left_allocated_mib": left, "left_reserved_mib": after["reserved_mib"] - before["reserved_mib"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--engine-root", type=Path, default=ROOT)
    ap.add_argument("--engine-roots", type=Path, nargs="+", default=[ROOT])
    ap.add_argument("--sizes", nargs="+", default=["0.6b"])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.ckpt, args.engine_root)))
        return
    import torch

    rows = []
    for size in args.sizes:
        ckpt = checkpoint(size)
        for root in args.engine_roots:
            r = run_fresh(__file__, ["--worker", "--ckpt", str(ckpt), "--engine-root", str(root)], timeout=600)
            r["size"] = size
            rows.append(r)
            print(json.dumps(r), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    (args.out / f"release_memory_{gpu_tag()}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("| size | engine root | allocated MiB before / loaded / after release | left allocated / reserved MiB |")
    print("|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['size']} | | error: {r['error'][:100]} | |")
            continue
        print(f"| {r['size']} | {r['engine_root']} | {r['before']['allocated_mib']:.0f} / "
              f"{r['loaded']['allocated_mib']:.0f} / {r['after_release']['allocated_mib']:.0f} | "
              f"{r['left_allocated_mib']:.1f} / {r['left_reserved_mib']:.1f} |")


if __name__ == "__main__":
    main()
