"""Where the join between two dependent GEMV phases spends its time, from timestamps every program takes
(%globaltimer, one clock for the whole GPU) inside the chain of bench/phase_cost.py (issue 14: what bounds a
phase, by launches and by a grid barrier?).

    python bench/join_timeline.py [--phases 21] [--warps 4 8] [--k 2048] [--out F.json]

The chain and its kernels are phase_cost's (`chained`, `one_phase`) with their stamps switched on: PHASES
GEMVs y = W_p x, N x K bf16 each, 128 programs of 16 rows, each phase's x the previous phase's y. Ways:

  pdl      one launch a phase with programmatic dependent launch, weights loaded before the wait (the engine's
           per-layer path), replayed from a CUDA graph;
  after    one persistent launch, a grid barrier between phases (predictor_pass._arrive / _wait), weights
           loaded after it (the opt-in predictor pass);
  before   the same, each phase's weights loaded into registers before the barrier that precedes it;
  late     as before, but the loads are issued after the program's arrival (the release atomic's fence waits
           for the thread's earlier memory operations, loads in flight included);
  none     the barrier and x alone, no weights (phase_cost's barrier_only).

Stamps a program takes in each phase p: X (its x has arrived: a scalar read of x issued after the vector read,
the stamp waits on it), D (its y stored, i.e. issued; the last thing a pdl program does), and on the barrier
ways A (its arrival counted: the release atomic's answer) and S (it saw the count reach the phase's target).
The stamp is predicated on a value it waits for, so it cannot be taken before that value has arrived.

Per phase, means over programs, inner phases and replays (the timer steps in 250 ns on an H200, so a mean
over thousands of stamps resolves finer than a median; medians and p90 are in the JSON):
  period  X(p+1) - X(p) of one program: what a phase costs;
  work    D(p) - X(p): weights (if loaded after the join), the products and the sum, the store's issue;
  skew    the last program's D(p) - the program's own D(p): how long it waits for the slowest;
  join    X(p+1) - the last program's D(p): from the phase's last store to this program holding the next x;
          barrier ways split it into A - D (the release fence and the atomic's round trip), S - the last
          A (the count reaching the pollers) and X - S (the acquire and the x read).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import phase_cost
from timing import best_of, mean_gpu_ms

N, BN, GRID = phase_cost.N, phase_cost.BN, phase_cost.GRID  # the chain's shape
K = 0  # set in main (--k)
WAYS = {"after": "after", "before": "before", "late": "late", "none": "barrier_only"}  # phase_cost's names


def launcher(way: str, phases: int, warps: int, w, act, bar, stamps):
    """phase_cost's chain, the way `way` joins it, with its stamps on."""
    chained, one_phase = phase_cost.kernels()[:2]
    if way == "pdl":
        def run():
            for p in range(phases):
                one_phase[(GRID,)](w, act, stamps, p, N=N, K=K, BN=BN, PDL=True, STAMPS=True, num_warps=warps,
                                   launch_pdl=True)
    else:
        def run():
            chained[(GRID,)](w, act, bar, stamps, PHASES=phases, WAY=phase_cost.WAY[WAYS[way]], N=N, K=K, BN=BN,
                             FLAG=False, FLAG_AT=0, STAMPS=True, num_warps=warps)
    return run


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def segments(t: torch.Tensor, way: str) -> dict:
    """Per-program, per-phase segments in µs from one replay's stamps [phases, programs, STAMP_SLOTS] (ns)."""
    t = t.double() / 1000.0
    x, d, a, s = t[..., 0], t[..., 1], t[..., 2], t[..., 3]
    phases = t.shape[0]
    inner = range(1, phases - 2)  # the first phase holds the launch, the last has no successor
    last_d = d.max(dim=1).values
    parts = {"period": [], "work": [], "skew": [], "join": []}
    if way != "pdl":
        parts |= {"fence_atomic": [], "count_reaches": [], "acquire_x": []}
        last_a = a.max(dim=1).values
    for p in inner:
        parts["period"] += (x[p + 1] - x[p]).tolist()
        parts["work"] += (d[p] - x[p]).tolist()
        parts["skew"] += (last_d[p] - d[p]).tolist()
        parts["join"] += (x[p + 1] - last_d[p]).tolist()
        if way != "pdl":
            parts["fence_atomic"] += (a[p] - d[p]).tolist()
            parts["count_reaches"] += (s[p] - last_a[p]).tolist()
            parts["acquire_x"] += (x[p + 1] - s[p]).tolist()
    diffs = (t.flatten().sort().values.diff() * 1000).round()
    tick = diffs[diffs > 0].min().item() if (diffs > 0).any() else 0.0
    return {"mean": {k: statistics.fmean(v) for k, v in parts.items()},
            "median": {k: statistics.median(v) for k, v in parts.items()},
            "p90": {k: pct(v, 0.9) for k, v in parts.items()}, "timer_tick_ns": tick}


def main() -> None:
    global K
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=21)
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--ways", nargs="+", default=["pdl", "after", "before", "late", "none"], choices=["pdl", *WAYS])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    K = args.k
    w, act, bar = phase_cost.chain_tensors(args.phases, K)
    stamps = torch.zeros(args.phases, GRID, phase_cost.STAMP_SLOTS, dtype=torch.int64, device="cuda")
    print(f"{torch.cuda.get_device_name()}: {args.phases} phases of {N}x{K} bf16 ({N * K * 2 / 1e6:.1f} MB), "
          f"{GRID} programs; µs, means over programs, replays and phases 1..{args.phases - 3}", flush=True)
    cols = ["period", "work", "skew", "join", "fence_atomic", "count_reaches", "acquire_x"]
    print("| way | warps | graph µs a phase | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 3))
    rows = []
    for warps in args.warps:
        for way in args.ways:
            g1 = phase_cost.graph_of(launcher(way, 1, warps, w, act, bar, stamps))
            gn = phase_cost.graph_of(launcher(way, args.phases, warps, w, act, bar, stamps))
            t1 = best_of(lambda _: mean_gpu_ms(g1.replay, 20), 5)
            tn = best_of(lambda _: mean_gpu_ms(gn.replay, 20), 5)
            graph_us = (tn - t1) * 1000 / (args.phases - 1)
            runs = []
            for _ in range(args.replays):  # stamps of separate replays, pooled
                gn.replay()
                torch.cuda.synchronize()
                runs.append(segments(stamps.cpu(), way))
            mean = {k: statistics.fmean(r["mean"][k] for r in runs) for k in runs[0]["mean"]}
            med = {k: statistics.median(r["median"][k] for r in runs) for k in runs[0]["median"]}
            p90 = {k: statistics.median(r["p90"][k] for r in runs) for k in runs[0]["p90"]}
            rows.append({"way": way, "warps": warps, "graph_us_per_phase": graph_us, "mean": mean, "median": med,
                         "p90": p90, "timer_tick_ns": min(r["timer_tick_ns"] for r in runs)})
            cells = " | ".join(f"{mean[c]:.2f}" if c in mean else "" for c in cols)
            print(f"| {way} | {warps} | {graph_us:.2f} | {cells} |", flush=True)
    print("timer tick (smallest step seen, ns):", min(r["timer_tick_ns"] for r in rows))
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "phases": args.phases, "n": N, "k": K,
                                        "programs": GRID, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
