"""Where the join between two dependent GEMV phases spends its time, from timestamps every program takes
(%globaltimer, one clock for the whole GPU) inside the chain of bench/phase_cost.py (issue 14: what bounds a
phase, by launches and by a grid barrier?).

    python bench/join_timeline.py [--phases 21] [--warps 4 8] [--k 2048] [--out F.json]

The chain: PHASES GEMVs y = W_p x, N x K bf16 each, 128 programs of 16 rows, each phase's x the previous
phase's y. Joined three ways:

  pdl      one launch a phase with programmatic dependent launch, weights loaded before the wait (the engine's
           per-layer path), replayed from a CUDA graph;
  after    one persistent launch, a grid barrier between phases (as predictor_pass._sync), weights loaded
           after it (the opt-in predictor pass);
  before   the same, each phase's weights loaded into registers before the barrier that precedes it;
  late     as before, but the loads are issued after the program's arrival (the release atomic's fence waits
           for the thread's earlier memory operations, loads in flight included);
  none     the barrier and x alone, no weights.

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
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, mean_gpu_ms

N = K = BN = 0  # set in main
GRID = 128
SLOTS = 4  # stamps a phase: X, D, A, S
LOAD = {"after": 0, "before": 1, "none": 2, "late": 3}


@functools.cache
def kernels():
    import triton
    import triton.language as tl

    from engine.kernels import pdl, predictor_pass

    enter = pdl.enter()
    predictor_pass._kernel()
    ld_acquire = predictor_pass._ld_acquire  # the poll of predictor_pass._sync

    @triton.jit
    def stamp(dep):
        # the read is predicated on a test of dep, so it waits for dep's value
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.eq.s32 p, $1, 2147483647; @p mov.u64 $0, 0; @!p mov.u64 $0, %globaltimer; }",
            "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def read_x(act_ptr, p, rk, N: tl.constexpr):
        """(x, X): the phase's x, and the stamp taken once a scalar read issued after it has arrived."""
        x = tl.load(act_ptr + p * N + rk, cache_modifier=".cg").to(tl.float32)
        first = tl.load(act_ptr + p * N, cache_modifier=".cg")
        return x, stamp(first.to(tl.int16, bitcast=True).to(tl.int32))

    @triton.jit
    def barrier_chain(w_ptr, act_ptr, bar_ptr, t_ptr, PHASES: tl.constexpr, LOAD: tl.constexpr, N: tl.constexpr,
                      K: tl.constexpr, BN: tl.constexpr):
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        tile = rn[:, None] * K + rk[None, :]
        w = tl.zeros([BN, K], tl.bfloat16)
        if LOAD == 1 or LOAD == 3:
            w = tl.load(w_ptr + tile)
        for p in range(PHASES):
            if LOAD == 0:
                w = tl.load(w_ptr + p * N * K + tile)
            x, t_x = read_x(act_ptr, p, rk, N)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(act_ptr + (p + 1) * N + rn, y.to(tl.bfloat16))
            t_d = stamp(pid)
            if LOAD == 1 and p + 1 < PHASES:
                w = tl.load(w_ptr + (p + 1) * N * K + tile)
            tl.debug_barrier()
            arrived = tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
            t_a = stamp(arrived)
            if LOAD == 3 and p + 1 < PHASES:  # after the release, so its fence cannot wait for these loads
                w = tl.load(w_ptr + (p + 1) * N * K + tile)
            seen = ld_acquire(bar_ptr)
            while seen < (p + 1) * grid:
                seen = ld_acquire(bar_ptr)
            t_s = stamp(seen)
            tl.debug_barrier()
            at = t_ptr + (p * grid + pid) * 4
            tl.store(at, t_x)
            tl.store(at + 1, t_d)
            tl.store(at + 2, t_a)
            tl.store(at + 3, t_s)
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)

    @triton.jit
    def pdl_phase(w_ptr, act_ptr, t_ptr, p, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        w = tl.load(w_ptr + p * N * K + rn[:, None] * K + rk[None, :])  # weights: before the wait
        enter(True)
        x, t_x = read_x(act_ptr, p, rk, N)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        tl.store(act_ptr + (p + 1) * N + rn, y.to(tl.bfloat16))
        t_d = stamp(pid)
        at = t_ptr + (p * tl.num_programs(0) + pid) * 4
        tl.store(at, t_x)
        tl.store(at + 1, t_d)

    return barrier_chain, pdl_phase


def launcher(way: str, phases: int, warps: int, w, act, bar, stamps):
    barrier_chain, pdl_phase = kernels()

    if way == "pdl":
        def run():
            for p in range(phases):
                pdl_phase[(GRID,)](w, act, stamps, p, N=N, K=K, BN=BN, num_warps=warps, launch_pdl=True)
    else:
        def run():
            barrier_chain[(GRID,)](w, act, bar, stamps, PHASES=phases, LOAD=LOAD[way], N=N, K=K, BN=BN,
                                   num_warps=warps)
    return run


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def segments(t: torch.Tensor, way: str) -> dict:
    """Per-program, per-phase segments in µs from one replay's stamps [phases, programs, SLOTS] (ns)."""
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
    global N, K, BN
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=21)
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--ways", nargs="+", default=["pdl", "after", "before", "late", "none"], choices=["pdl", *LOAD])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    N, K, BN = 2048, args.k, 16

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if GRID > sms:
        raise SystemExit(f"{GRID} programs need {GRID} SMs for the barrier (this GPU has {sms})")
    w = torch.randn(args.phases * N * K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    act = torch.randn((args.phases + 1) * N, device="cuda", dtype=torch.bfloat16)
    bar = torch.zeros(2, dtype=torch.int32, device="cuda")
    stamps = torch.zeros(args.phases, GRID, SLOTS, dtype=torch.int64, device="cuda")
    print(f"{torch.cuda.get_device_name()}: {args.phases} phases of {N}x{K} bf16 ({N * K * 2 / 1e6:.1f} MB), "
          f"{GRID} programs; µs, means over programs, replays and phases 1..{args.phases - 3}", flush=True)
    cols = ["period", "work", "skew", "join", "fence_atomic", "count_reaches", "acquire_x"]
    print("| way | warps | graph µs a phase | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 3))
    rows = []
    for warps in args.warps:
        for way in args.ways:
            g1 = graph_of(launcher(way, 1, warps, w, act, bar, stamps))
            gn = graph_of(launcher(way, args.phases, warps, w, act, bar, stamps))
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
