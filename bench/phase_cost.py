"""What one dependent GEMV phase costs, by the way phases are joined (issue 14: can a persistent pass beat
the per-layer launches?).

    python bench/phase_cost.py [--phases 21] [--warps 8 16] [--out F.json]

A synthetic chain shaped like a code-predictor pass: PHASES GEMVs, each y = W_p x over its own [N, K] bf16
weight (N = K = 2048, 8 MB; all phases together are past L2, so every phase streams from HBM), each phase's x
the previous phase's y. Programs: 128, each owns 16 rows of every W_p (64 KB a phase), as the persistent
pass does. Ways of joining the phases:

  launches      one launch a phase, captured in a CUDA graph, plain launches;
  launches_pdl  the same with programmatic dependent launch, weights loaded before the wait (the per-layer
                path today: engine/kernels/pdl.py);
  after         one persistent launch, a grid barrier between phases, each phase's weights loaded after
                its barrier (the opt-in predictor_pass with its L2 prefetch off);
  before        one persistent launch, each phase's weights loaded into registers *before* the barrier that
                precedes it, so HBM streams while the grid waits;
  no_barrier    one launch, no barrier (wrong results: the floor of streaming the weights in one launch);
  barrier_only  one launch, barriers and the activation reads, no weight loads (the barrier's own cost);
  *_flag        after / before / barrier_only with another barrier: the arrivals count on one 128-byte line,
                the last arrival raises a flag on another, and the programs wait on the flag with acquire
                loads (predictor_pass._sync spins on the counter the arrivals hit, then makes an acquire
                atomic there: every program's atomics and polls share one line).

Per phase = (time of PHASES phases - time of 1 phase) / (PHASES - 1), so the launch and the first ramp
cancel out. GPU time of a CUDA-graph replay (events), best of 5 means of 20 replays.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, mean_gpu_ms

N = K = 2048
BN = 16
GRID = N // BN
_sync = _enter = _flag_sync = _ld_acquire = None  # bound by kernels(): a jit function finds its helpers among
# its module's globals
MODES = ("launches", "launches_pdl", "after", "before", "no_barrier", "barrier_only", "after_flag", "before_flag",
         "barrier_only_flag")
WAY = {"after": 0, "before": 1, "no_barrier": 2, "barrier_only": 3}
FLAG_AT = 32  # int32 slots: the flag sits on its own 128-byte line


@functools.cache
def kernels():
    global _sync, _enter, _flag_sync, _ld_acquire
    import triton
    import triton.language as tl

    from engine.kernels import pdl, predictor_pass

    predictor_pass._kernel()
    _sync, _enter = predictor_pass._sync, pdl.enter()

    @triton.jit
    def _ld_acquire(ptr):
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                         is_pure=False, pack=1)

    @triton.jit
    def _flag_sync(bar_ptr, phase, grid, FLAG_AT: tl.constexpr):
        tl.debug_barrier()  # the program's stores of this phase are issued before it counts itself in
        arrived = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == phase * grid - 1:
            tl.atomic_xchg(bar_ptr + FLAG_AT, phase, sem="release", scope="gpu")
        seen = _ld_acquire(bar_ptr + FLAG_AT)
        while seen < phase:
            seen = _ld_acquire(bar_ptr + FLAG_AT)
        tl.debug_barrier()

    @triton.jit
    def chained(w_ptr, act_ptr, bar_ptr, PHASES: tl.constexpr, WAY: tl.constexpr, N: tl.constexpr,
                K: tl.constexpr, BN: tl.constexpr, FLAG: tl.constexpr, FLAG_AT: tl.constexpr):
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        tile = rn[:, None] * K + rk[None, :]
        w = tl.zeros([BN, K], tl.bfloat16)
        if WAY == 1 or WAY == 2:
            w = tl.load(w_ptr + tile)
        for p in range(PHASES):
            if WAY == 0:
                w = tl.load(w_ptr + p * N * K + tile)
            x = tl.load(act_ptr + p * K + rk, cache_modifier=".cg").to(tl.float32)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(act_ptr + (p + 1) * K + rn, y.to(tl.bfloat16))
            if WAY == 1 or WAY == 2:
                if p + 1 < PHASES:
                    w = tl.load(w_ptr + (p + 1) * N * K + tile)
            if WAY != 2:
                if FLAG:
                    _flag_sync(bar_ptr, p + 1, grid, FLAG_AT)
                else:
                    _sync(bar_ptr, (p + 1) * grid)
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)
            if FLAG:
                tl.atomic_xchg(bar_ptr + FLAG_AT, 0)

    @triton.jit
    def one_phase(w_ptr, act_ptr, p, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        w = tl.load(w_ptr + p * N * K + rn[:, None] * K + rk[None, :])  # weights: before the wait
        _enter(PDL)
        x = tl.load(act_ptr + p * K + rk).to(tl.float32)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        tl.store(act_ptr + (p + 1) * K + rn, y.to(tl.bfloat16))

    return chained, one_phase


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def measure(mode: str, phases: int, warps: int, w, act, bar) -> float:
    chained, one_phase = kernels()
    if mode.startswith("launches"):
        pdl = {"PDL": True, "launch_pdl": True} if mode == "launches_pdl" else {"PDL": False}

        def fn():
            for p in range(phases):
                one_phase[(GRID,)](w, act, p, N=N, K=K, BN=BN, num_warps=warps, **pdl)
    else:
        def fn():
            chained[(GRID,)](w, act, bar, PHASES=phases, WAY=WAY[mode.removesuffix("_flag")], N=N, K=K, BN=BN,
                             FLAG=mode.endswith("_flag"), FLAG_AT=FLAG_AT, num_warps=warps)
    g = graph_of(fn)
    return best_of(lambda _: mean_gpu_ms(g.replay, 20), 5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=21)
    ap.add_argument("--warps", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if GRID > sms:
        raise SystemExit(f"{GRID} programs need {GRID} SMs for the barrier (this GPU has {sms})")
    w = torch.randn(args.phases * N * K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    act = torch.randn((args.phases + 1) * K, device="cuda", dtype=torch.bfloat16)
    bar = torch.zeros(2 * FLAG_AT, dtype=torch.int32, device="cuda")
    rows = []
    print(f"{torch.cuda.get_device_name()}: {args.phases} phases of {N}x{K} bf16 ({N * K * 2 / 1e6:.1f} MB), "
          f"{GRID} programs", flush=True)
    print("| way | warps | us a phase | us for 1 phase | TB/s in the chain |\n|---|---|---|---|---|")
    for warps in args.warps:
        for mode in args.modes:
            try:
                t1 = measure(mode, 1, warps, w, act, bar)
                tn = measure(mode, args.phases, warps, w, act, bar)
            except Exception as exc:  # one way failing (registers, a hang guard) must not lose the others
                print(f"| {mode} | {warps} | failed: {type(exc).__name__}: {str(exc)[:120]} | | |", flush=True)
                continue
            per = (tn - t1) * 1000 / (args.phases - 1)
            tbs = N * K * 2 / (per * 1e-6) / 1e12
            rows.append({"mode": mode, "warps": warps, "us_per_phase": per, "us_one_phase": t1 * 1000,
                         "tb_s": tbs})
            print(f"| {mode} | {warps} | {per:.2f} | {t1 * 1000:.2f} | {tbs:.2f} |", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "phases": args.phases, "n": N, "k": K,
                                        "programs": GRID, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
