"""Who holds the memory a load reserves but does not use: the free bytes stranded in the caching allocator's
segments (a segment goes back to the driver only when every block in it is free), named by the code that last
allocated them, and the live blocks that pin them.

    python bench/load_memory.py --roots LABEL=DIR [LABEL=DIR ...] [--size 0.6b] --out DIR --name NAME

Each tree loads once in a fresh process, with the node's defaults (bf16, CUDA graphs on, Triton auto), under
torch's allocator history (Python stacks: the load is slower than unrecorded, so no time is reported). The
memory is read when the weights are in (just before the graphs are captured) and after the load. Each free
block of a used segment is named by the last allocation that covered its address; each live block by its own.
A site is the innermost frame in the engine's code (or, if none, the innermost frame). Prints the top sites;
writes DIR/load_memory_NAME.json.
"""
from __future__ import annotations

import bisect
import sys
from pathlib import Path

from engine_probe import before_graphs
from gpu_bench import checkpoint
from timing import gpu_tag, run_tree, tree_ab_args, tree_ab_parser, write_json

TOP = 8


def site(frames: list) -> str:
    """The innermost frame in the engine's code (or the innermost frame), as file:line function."""
    pick = next((f for f in frames if "/engine/" in f.get("filename", "")), frames[0] if frames else None)
    if pick is None:
        return "?"
    name = pick["filename"].split("/engine/")[-1] if "/engine/" in pick["filename"] else pick["filename"]
    return f"{name}:{pick['line']} {pick['name']}"


def stranded_by_site(snapshot: dict) -> dict:
    """{'stranded': [(site, MB)], 'pinning': [(site, MB)], totals}: the general pool's used segments only."""
    last = {}  # address -> (size, frames) of the latest allocation there (the trace is in time order)
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e["action"] == "alloc":
                last[e["addr"]] = (e["size"], e.get("frames", []))
    starts = sorted(last)
    stranded, pinning = {}, {}
    total_free = total_live = 0
    for seg in snapshot["segments"]:
        if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0) or seg["allocated_size"] == 0:
            continue
        addr = seg["address"]
        for block in seg["blocks"]:
            size = block["size"]
            if block["state"] == "active_allocated":
                total_live += size
                where = site(block.get("frames", []))
                pinning[where] = pinning.get(where, 0) + size
            elif block["state"] == "inactive":
                total_free += size
                i = bisect.bisect_right(starts, addr) - 1  # the last allocation starting at or before it
                where = "never allocated"
                if i >= 0 and starts[i] + last[starts[i]][0] > addr:
                    where = site(last[starts[i]][1])
                stranded[where] = stranded.get(where, 0) + size
            addr += size

    def top(d):
        return [(k, v / 2**20) for k, v in sorted(d.items(), key=lambda kv: -kv[1])]
    return {"stranded_mb": total_free / 2**20, "live_in_those_segments_mb": total_live / 2**20,
            "stranded": top(stranded), "pinning": top(pinning)}


def worker(root: Path, ckpt: Path) -> dict:
    import torch

    sys.path.insert(0, str(root))
    from engine import Engine

    torch.zeros(1, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    stages = {}

    def read(name):
        torch.cuda.synchronize()
        stages[name] = {"reserved_mb": torch.cuda.memory_reserved() / 2**20,
                        "allocated_mb": torch.cuda.memory_allocated() / 2**20,
                        **stranded_by_site(torch.cuda.memory._snapshot())}

    before_graphs(lambda: read("weights in, before the graphs"))
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    read("after the load")
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"stages": stages, "notes": eng.info.notes}


def main() -> None:
    args, roots = tree_ab_args(tree_ab_parser(), worker)
    import torch

    ckpt = checkpoint(args.size)
    out = {}
    for label, root in roots.items():
        r = out[label] = run_tree(__file__, label, root, ckpt)
        for stage, s in r["stages"].items():
            print(f"\n{label}, {stage}: reserved {s['reserved_mb']:.0f} MB, allocated {s['allocated_mb']:.0f} MB, "
                  f"stranded in used general segments {s['stranded_mb']:.0f} MB")
            print("  stranded, by the last allocation there: " + "; ".join(
                f"{k} {v:.0f}" for k, v in s["stranded"][:TOP]))
            print("  live blocks in those segments: " + "; ".join(f"{k} {v:.0f}" for k, v in s["pinning"][:TOP]))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"load_memory_{args.name or gpu_tag()}.json"
    write_json(path, {"gpu": torch.cuda.get_device_name(0), "size": args.size, "roots": roots, "runs": out})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
