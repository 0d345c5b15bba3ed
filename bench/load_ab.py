"""Engine loads A/B: each load in a fresh process, the engine trees taking turns, each load followed by its
first request.

    python bench/load_ab.py --roots LABEL=DIR [LABEL=DIR ...] [--rounds 4] [--takes 1] [--size 0.6b]
                            [--env LABEL:NAME=VALUE ...] --out DIR --name NAME

A round loads once from each tree in turn, so a machine that slows down slows every tree alike. The first round
may compile Triton kernels (a machine's first start) and is reported apart; the later ones find the cache
warm, as a user's second start does. Per load: `Engine.load` with the node's defaults (bf16, CUDA graphs on,
Triton auto), timed to a synchronised device; the process's CUDA start is timed apart (ComfyUI pays it at
launch); then the first two requests, a 40-frame line (3.2 s of audio) at one take, or with --takes N loaded as
the loader node loads for max_takes N (warm_takes N where the tree has it) and run at N takes.

Each load's steps are kept as host-clock spans with their threads, taken without any sync of their own
(load_trace.py: its critical path, printed per load). From them come how long the codec's capture threads ran
and how long the load waited for them; a stamp of its own gives when the weights were in (graphs start). --env
runs a label's workers with an environment variable of their own: a variant of the same tree, or one of
load_trace's diagnosis switches (the codec's captures on the main thread, a stack sampler, cProfile). For a
profile with a sync per step, see load_profile.py. Prints a table; writes DIR/load_ab_NAME.json.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from engine_probe import before_graphs, node_load_kwargs, script_params
from gpu_bench import checkpoint
from load_trace import apply_switches, codec_times, profile_tables, record_spans, span_summary
from timing import gpu_tag, run_tree, tree_ab_args, tree_ab_parser

FIRST_FRAMES = 40
TAKES_ENV = "LOAD_AB_TAKES"
TEXT = "The first line a user asks for after the model is loaded."


def segments_by_pool_and_stream(snapshot: list) -> list:
    """Where the reserved memory sits after a load: the caching allocator's segments grouped by pool (a graph's
    private pool, or the general one) and by the stream that made them, with the bytes they hold and the bytes
    allocated in them. Free bytes in a segment that still holds an allocated block cannot be given back."""
    groups = {}
    for seg in snapshot:
        pool = "general" if tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0) else "graph pool"
        key = (pool, seg.get("stream", 0))
        g = groups.setdefault(key, {"pool": pool, "stream": key[1], "segments": 0, "reserved_mb": 0.0,
                                    "allocated_mb": 0.0, "stranded_mb": 0.0})
        total, used = seg["total_size"] / 2**20, seg["allocated_size"] / 2**20
        g["segments"] += 1
        g["reserved_mb"] += total
        g["allocated_mb"] += used
        if used > 0:
            g["stranded_mb"] += total - used
    return sorted(groups.values(), key=lambda g: -g["reserved_mb"])


def worker(root: Path, ckpt: Path) -> dict:
    import torch

    sys.path.insert(0, str(root))
    from engine import Engine, Request

    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    cuda_start_s = time.perf_counter() - t
    split = {}  # graphs_at: when the weights are in and the graphs start (a host stamp, no sync)
    before_graphs(lambda: split.__setitem__("graphs_at", time.perf_counter()))
    spans = record_spans()
    sampler, profile = apply_switches()
    takes = int(os.environ.get(TAKES_ENV, "1"))
    load_kw = node_load_kwargs(Engine, takes) if takes > 1 else {}  # one take: the engine's own defaults
    t = time.perf_counter()
    if sampler:
        sampler.start()
    if profile:
        profile.enable()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", **load_kw)
    torch.cuda.synchronize()
    if profile:
        profile.disable()
    load_s = time.perf_counter() - t
    stacks = sampler.stop() if sampler else []
    if profile:
        split.update(profile_tables(profile))
    spans = [{**sp, "start_s": sp["start_s"] - t, "end_s": sp["end_s"] - t} for sp in spans]
    split.update(codec_times(spans, load_s))
    if "graphs_at" in split:  # a host timestamp taken inside the load (no sync of its own)
        split["weights_s"] = split.pop("graphs_at") - t
    memory = {"reserved_gb": torch.cuda.memory_reserved() / 1e9, "allocated_gb": torch.cuda.memory_allocated() / 1e9,
              "segments": segments_by_pool_and_stream(torch.cuda.memory_snapshot())}
    req = Request(mode="custom", text=TEXT, language="English", speaker=eng.speakers[0])
    t = time.perf_counter()
    res = eng.generate(req, takes=takes, params=script_params(eng, FIRST_FRAMES))
    first_request_s = time.perf_counter() - t
    assert res.stats["frames"] == FIRST_FRAMES, res.stats
    t = time.perf_counter()
    eng.generate(req, takes=takes, params=script_params(eng, FIRST_FRAMES))
    second_request_s = time.perf_counter() - t
    return {"cuda_start_s": cuda_start_s, "load_s": load_s, "takes": takes, "first_request_s": first_request_s,
            "second_request_s": second_request_s, **memory,
            **split, "spans": spans, "stacks": stacks, "notes": eng.info.notes}


def main() -> None:
    ap = tree_ab_parser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--takes", type=int, default=1, help="load for this many takes (max_takes, and warm_takes where "
                    "the tree has it, as the loader node does) and run the first requests at that many")
    ap.add_argument("--env", action="append", default=[], metavar="LABEL:NAME=VALUE",
                    help="an environment variable for LABEL's workers only (a variant of the same tree)")
    args, roots = tree_ab_args(ap, worker)
    os.environ[TAKES_ENV] = str(args.takes)  # the fresh worker processes inherit it
    extra = {}
    for spec in args.env:
        label, assignment = spec.split(":", 1)
        name, value = assignment.split("=", 1)
        extra.setdefault(label, {})[name] = value
    import torch

    ckpt = checkpoint(args.size)
    runs = {label: [] for label in roots}
    for i in range(args.rounds):
        for label, root in roots.items():
            r = run_tree(__file__, label, root, ckpt, env=extra.get(label))
            r["env"] = extra.get(label, {})
            r["round"] = i
            runs[label].append(r)
            print(f"round {i} {label:10s} load {r['load_s']:.2f} s (weights {r.get('weights_s', 0):.2f}, codec thread "
                  f"{r.get('codec_thread_s', 0):.2f}, waited {r.get('thread_wait_s', 0):.2f}), first / second request "
                  f"{r['first_request_s'] * 1e3:.0f} / {r['second_request_s'] * 1e3:.0f} ms at {args.takes} takes, "
                  f"reserved / allocated {r['reserved_gb']:.2f} / "
                  f"{r['allocated_gb']:.2f} GB", flush=True)
            print(span_summary(r["spans"], r["load_s"]), flush=True)
            for key in ("profile_tottime", "profile_cumulative"):
                if key in r:
                    print(r[key][-6000:])
            for st in r.get("stacks", [])[:30]:
                print(f"      {st['samples']:5d} {st['thread']:17s} {st['engine']:50s} {st['leaf']}")
    print(f"\n{args.size}, {torch.cuda.get_device_name(0)}, rounds 2..{args.rounds} (warm Triton cache)\n")
    print(f"| tree | loads | load median s | load min-max s | over 3 s | first / second request median ms "
          f"({args.takes} takes) | load + first request median s | round 1 load s |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for label, rs in runs.items():
        later = rs[1:] or rs[:1]  # the warm-cache rounds (round 1 alone if that is all)
        warm = [r["load_s"] for r in later]
        first = [1000 * r["first_request_s"] for r in later]
        second = [1000 * r["second_request_s"] for r in later]
        total = [r["load_s"] + r["first_request_s"] for r in later]
        summary[label] = {"load_median_s": statistics.median(warm), "load_min_s": min(warm), "load_max_s": max(warm),
                          "over_3s": sum(x > 3 for x in warm), "first_request_median_ms": statistics.median(first),
                          "second_request_median_ms": statistics.median(second),
                          "load_and_first_request_median_s": statistics.median(total), "takes": args.takes}
        s = summary[label]
        print(f"| {label} | {len(warm)} | {s['load_median_s']:.2f} | {s['load_min_s']:.2f}-{s['load_max_s']:.2f} | "
              f"{s['over_3s']} | {s['first_request_median_ms']:.0f} / {s['second_request_median_ms']:.0f} | "
              f"{s['load_and_first_request_median_s']:.2f} | {rs[0]['load_s']:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"load_ab_{args.name or gpu_tag()}.json"
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "size": args.size, "roots": roots,
                               "summary": summary, "runs": runs}, indent=2))
    print("\nreserved after the last load, by pool and stream (MB): reserved / allocated / free in used segments")
    for label, rs in runs.items():
        print(label, "; ".join(f"{g['pool']} s{g['stream']}: {g['reserved_mb']:.0f} / {g['allocated_mb']:.0f} / "
                               f"{g['stranded_mb']:.0f} ({g['segments']} seg)" for g in rs[-1]["segments"][:6]))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
