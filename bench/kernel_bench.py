"""Decode-shape microbenchmarks of the Triton kernels (engine/kernels) against their torch references.

Each op is captured 50 times into one CUDA graph and the graph replayed, so the time per op includes
the in-graph launch cost the whole-frame graph pays. Rows M = 1, 4, 8, 16; 0.6B / 1.7B widths.

    python bench/kernel_bench.py --out bench/results/kernels [--dtype bf16] [--reps 20]
    python bench/kernel_bench.py --linear-sweep --linear-grid wide --rows 4 8 16 --jobs 12 --out DIR
    python bench/kernel_bench.py --attention --out bench/results/kernels [--rows 1 16] [--windows 256 1024]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from timing import write_json  # bench/ is on sys.path when a bench runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import kernels
from engine.kernels import (
    attention,
    linear,
    qk_norm_rope_kv,
    rms_norm,
    sample,
)
from engine.kernels._util import sm_count
from tests.support import kernels_selftest as selftest

ROWS = (1, 4, 8, 16)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def graph_time_us(fn, inner=50, reps=20) -> float:
    """Median microseconds per call of fn, measured as replays of a graph holding `inner` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    times.sort()
    return times[len(times) // 2]


L2_BYTES = 256 << 20  # weights rotate through more memory than any L2, so matmul timings are HBM-bound


def linear_inputs(dt, dev, m, n, k, prologue, residual, bias):
    """The input rows of one decode matmul and its keyword arguments (unit norm weight, zero bias and residual)."""
    x = torch.randn(m, 1, 2 * k if prologue == "silu_mul" else k, device=dev, dtype=dt)
    args = {"prologue": prologue,
            "norm_weight": torch.ones(k, device=dev, dtype=dt) if prologue == "rms_norm" else None,
            "bias": torch.zeros(n, device=dev, dtype=dt) if bias else None,
            "residual": torch.zeros(m, 1, n, device=dev, dtype=dt) if residual else None}
    return x, args


def linear_case(dt, dev, m, n, k, prologue, residual, bias, **launch):
    """(kernel fn, reference fn) for one decode matmul; each call reads the next of several weight copies."""
    copies = max(2, L2_BYTES // (n * k * 2))
    ws = [torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5 for _ in range(copies)]
    x, args = linear_inputs(dt, dev, m, n, k, prologue, residual, bias)
    turn = [0]

    def weight():
        turn[0] += 1
        return ws[turn[0] % copies]

    return (lambda: linear.linear(x, weight(), **args, **launch)), (lambda: linear.reference(x, weight(), **args))


def sweep_configs(m: int) -> list:
    """Launch configurations tried at m rows: FMA and tensor-core tiles (at 3-8 rows only the tensor-core
    configuration in use, against smaller FMA tiles)."""
    import itertools

    if m <= 2:
        fma = itertools.product((8, 16), (512, 1024), (1, 3))
    elif m <= 8:
        fma = itertools.product((8, 16), (128, 256), (3,))
    else:
        fma = ()
    dot = [(32, 256, 3)] if 2 < m <= 8 else itertools.product((16, 32), (256, 512), (1, 3))
    return ([{"BLOCK_N": bn, "BLOCK_K": bk, "num_stages": st, "FMA_ROWS": 16} for bn, bk, st in fma]
            + [{"BLOCK_N": bn, "BLOCK_K": bk, "num_stages": st, "FMA_ROWS": 0} for bn, bk, st in dot])


def wide_configs(m: int) -> list:
    """--linear-grid wide: the tensor-core path at 3+ rows over wider column tiles, the swapped product
    (weight tile on the MMA's M side, rows on its N side) and warp counts; the first entry is CONFIG's."""
    if m <= 2:
        return sweep_configs(m)
    base = {**linear.CONFIG["dot"], "FMA_ROWS": 0}
    base.pop("PROGRAMS_PER_SM")
    grid = [(False, 32, 256, 4), (False, 64, 256, 4), (False, 128, 128, 4), (True, 64, 128, 4), (True, 64, 256, 4),
            (True, 128, 128, 4), (True, 128, 128, 8), (True, 128, 256, 8)]
    out = [base]
    for swap, bn, bk, warps in grid:
        cfg = {**base, "SWAP_AB": swap, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps}
        if cfg not in out:
            out.append(cfg)
    return out


def tune_configs(m: int) -> list:
    """--linear-grid tune: CONFIG's tensor-core entries, the swapped product at other stage counts, K steps
    (its shared memory sets how many programs fit an SM) and 32 columns."""
    if m <= 2:
        return sweep_configs(m)
    plain, rms, swiglu = ({**{k: v for k, v in linear.CONFIG[path].items() if k != "PROGRAMS_PER_SM"},
                           "FMA_ROWS": 0} for path in ("dot", "dot_rms_norm", "dot_silu_mul"))
    return [plain, rms, {**rms, "BLOCK_N": 32}, {**swiglu, "num_stages": 2}, {**swiglu, "BLOCK_K": 128},
            {**swiglu, "BLOCK_K": 128, "num_stages": 4}, {**plain, "num_stages": 2}]


def plan_configs(m: int) -> list:
    """--linear-grid plan: the engine's own launch (CONFIG and PROGRAMS_PER_SM)."""
    return [None]


GRIDS = {"base": (sweep_configs, (2, 4)), "wide": (wide_configs, (1, 2, 4)), "tune": (tune_configs, (0.5, 1, 2)),
         "plan": (plan_configs, (None,))}


_CONSTEXPRS = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "USE_DOT", "SWAP_AB", "PROLOGUE")


def _target(mult, sms):
    return None if mult is None else round(mult * sms)


def _precompile(tasks):
    """Worker of linear_sweep's parallel compile: one small launch per (rows, shape, config, dtype), which
    leaves the kernel in Triton's on-disk cache for the timing process."""
    for m, n, k, prologue, residual, bias, config, target, dtname in tasks:
        dt = DTYPES[dtname]
        try:
            _launch_once(m, n, k, prologue, residual, bias, config, target, dt)
        except Exception as e:  # noqa: BLE001 (a tile too big for shared memory: the timing loop reports it)
            print(f"compile failed: {config} {type(e).__name__}: {str(e)[:200]}", flush=True)
    torch.cuda.synchronize()
    return len(tasks)


def _launch_once(m, n, k, prologue, residual, bias, config, target, dt):
    """One small launch of the kernel (it compiles on the first)."""
    x, args = linear_inputs(dt, "cuda", m, n, k, prologue, residual, bias)
    linear.linear(x, torch.randn(n, k, device="cuda", dtype=dt), **args, config=config, target=target)


def precompile(dt, row_counts, configs_for, mults, jobs, sms):
    """Compile every kernel variant the sweep will launch in `jobs` processes (Triton compiles one at a
    time per process; the timing loop then finds them cached)."""
    import itertools
    import multiprocessing

    dtname = next(key for key, v in DTYPES.items() if v == dt)
    seen, tasks = set(), []
    for m in row_counts:
        for (n, k, prologue, residual, bias), config, mult in itertools.product(selftest.LINEAR_SHAPES,
                                                                                configs_for(m), mults):
            p = linear.plan(m, n, k, config, _target(mult, sms), prologue=prologue)
            key = (m == 1, m % 16 == 0, prologue, residual, bias, *(p[c] for c in _CONSTEXPRS),
                   p["splits"] == 1 and k <= p["BLOCK_K"], p["BLOCK_M"])
            if key not in seen:
                seen.add(key)
                tasks.append((m, n, k, prologue, residual, bias, config, _target(mult, sms), dtname))
    t = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        done = sum(pool.map(_precompile, [tasks[i::jobs] for i in range(jobs)]))
    print(f"compiled {done} kernel variants in {time.perf_counter() - t:.1f} s ({jobs} processes)", flush=True)


def linear_sweep(dt, dev, reps, row_counts=(1, 16), grid="base", jobs=0):
    """Time every launch configuration at every decode matmul shape."""
    import itertools

    sms = sm_count(dev)
    configs_for, mults = GRIDS[grid]
    if jobs > 1:
        precompile(dt, row_counts, configs_for, mults, jobs, sms)
    rows = []
    for m in row_counts:
        for n, k, prologue, residual, bias in selftest.LINEAR_SHAPES:
            _, ref = linear_case(dt, dev, m, n, k, prologue, residual, bias)
            t_ref = graph_time_us(ref, reps=reps)
            for config, mult in itertools.product(configs_for(m), mults):
                fn, _ = linear_case(dt, dev, m, n, k, prologue, residual, bias, config=config,
                                    target=_target(mult, sms))
                try:
                    t = graph_time_us(fn, inner=20, reps=reps)
                except Exception as e:  # noqa: BLE001 (e.g. Triton's OutOfResources for a too-large tile)
                    torch.cuda.synchronize()
                    print(f"M={m} N={n} K={k} {config} target={_target(mult, sms)}: "
                          f"{type(e).__name__}: {str(e)[:200]}")
                    continue
                p = linear.plan(m, n, k, config, _target(mult, sms), prologue=prologue)
                rows.append({"M": m, "N": n, "K": k, "prologue": prologue, **(config or {}), "target": p["target"],
                             "BLOCK_N": p["BLOCK_N"], "BLOCK_K": p["BLOCK_K"], "num_stages": p["num_stages"],
                             "dot": p["USE_DOT"], "swap": p["SWAP_AB"], "num_warps": p["num_warps"],
                             "splits": p["splits"], "us": round(t, 2),
                             "torch_us": round(t_ref, 2), "GBps": round(n * k * 2 / t / 1e3, 1)})
            best = min((r for r in rows if (r["M"], r["N"], r["K"]) == (m, n, k)), key=lambda r: r["us"])
            print(f"M={m:2d} N={n:5d} K={k:5d} {prologue:8s} best {best['us']:6.2f} us ({best['GBps']} GB/s) "
                  f"dot={best['dot']} swap={best['swap']} warps={best['num_warps']} BN={best['BLOCK_N']} "
                  f"BK={best['BLOCK_K']} st={best['num_stages']} target={best['target']} "
                  f"splits={best['splits']}; torch {t_ref:.2f} us", flush=True)
    return rows


def attention_sweep(dt, dev, reps, row_counts=(1, 16), windows=(256, 512, 1024, 2048)):
    """The talker's attention (nh 16, nkv 8, D 128; per-row [B, 1, 1, W] bias, every row at W - 3
    positions) as torch's four ops against the Triton kernel: one program per (row, kv head), and the
    split-KV path at the plan's chunk and at fixed chunks, FMA and tensor-core products, with and
    without PDL. Each call reads the next of several cache copies (HBM-bound, as 28 layers are)."""
    rows = []
    for m in row_counts:
        for w in windows:
            rows += attention_point(dt, dev, reps, m, w)
    return rows


def attention_point(dt, dev, reps, m, w, nh=16, nkv=8, d=128):
    from engine.kernels import pdl as kpdl

    sms = sm_count(dev)
    copies = max(2, L2_BYTES // (2 * m * nkv * w * d * dt.itemsize))
    caches = [(torch.randn(m, nkv, w, d, device=dev, dtype=dt), torch.randn(m, nkv, w, d, device=dev, dtype=dt))
              for _ in range(copies)]
    q = torch.randn(m, nh, d, device=dev, dtype=dt)
    seen = torch.arange(w, device=dev)[None] < torch.full((m, 1), w - 3, device=dev)
    bias = torch.where(seen, 0.0, float("-inf")).to(dt)[:, None, None].contiguous()
    turn = [0]

    def kv():
        turn[0] += 1
        return caches[turn[0] % copies]

    def ref():
        return attention.reference(q, *kv(), bias, d ** -0.5)

    t_ref = graph_time_us(ref, reps=reps)
    variants = [("one_program", {"chunk": w, "block_n": 32}, False)]
    for dot in (False, True):
        tag = "dot" if dot else "fma"
        variants.append((f"split_{tag}_plan", {"config": {"USE_DOT": dot}}, False))
        if kpdl.support(dev)[0]:
            variants.append((f"split_{tag}_plan_pdl", {"config": {"USE_DOT": dot}}, True))
        for bn, warps in ((16, 4), (32, 4), (32, 8), (64, 8)):  # the plan's chunk rule at other tiles
            cfg = {"USE_DOT": dot, "BLOCK_N": bn, "MIN_CHUNK": max(bn, 32), "num_warps": warps}
            variants.append((f"split_{tag}_bn{bn}_w{warps}", {"config": cfg}, False))
        variants += [(f"split_{tag}", {"config": {"USE_DOT": dot}, "chunk": c}, False) for c in (16, 32, 64, 128, 256)
                     if c < w]
    rows = []
    for name, kw, use_pdl in variants:
        def fn(kw=kw, use_pdl=use_pdl):
            return attention.attention(q, *kv(), bias, d ** -0.5, pdl=use_pdl, **kw)

        t = graph_time_us(fn, reps=reps)
        p = attention.plan(m, nkv, w, sms, kw.get("chunk"), kw.get("config"), kw.get("block_n", 16))
        rows.append({"B": m, "W": w, "variant": name, "chunk": p["chunk"], "splits": p["splits"], "pdl": use_pdl,
                     "us": round(t, 2), "torch_us": round(t_ref, 2), "speedup": round(t_ref / t, 2),
                     "GBps": round(2 * m * nkv * w * d * dt.itemsize / t / 1e3, 1)})
        print(f"B={m:2d} W={w:5d} {name:24s} chunk={p['chunk']:5d} splits={p['splits']:3d} "
              f"{t:8.2f} us  torch {t_ref:8.2f} us  x{t_ref / t:5.2f}", flush=True)
    return rows


def cases(dt, dev):
    """(name, shape dict, triton fn, reference fn, torch kernels replaced) at decode shapes."""
    out = []
    for m in ROWS:
        for n in (1024, 2048):
            x = torch.randn(m, 1, n, device=dev, dtype=dt)
            w = torch.randn(n, device=dev, dtype=dt)
            out.append(("rms_norm", {"M": m, "N": n}, lambda x=x, w=w: rms_norm.rms_norm(x, w, 1e-6),
                        lambda x=x, w=w: rms_norm.reference(x, w, 1e-6)))
        for n, k, prologue, residual, bias in selftest.LINEAR_SHAPES:
            fn, ref = linear_case(dt, dev, m, n, k, prologue, residual, bias)
            out.append(("linear", {"M": m, "N": n, "K": k, "prologue": prologue, "residual": residual,
                                   "bias": bias}, fn, ref))
        nh, nkv, d = 16, 8, 128
        qkv = torch.randn(m, 1, (nh + 2 * nkv) * d, device=dev, dtype=dt)
        wq = torch.ones(nh + nkv, d, device=dev, dtype=dt)
        cos, sin = selftest.rope_tables(d, 100, dt, dev)
        kc, vc = (torch.zeros(m, nkv, 2048, d, device=dev, dtype=dt) for _ in range(2))
        pos = torch.tensor([100], device=dev)
        out.append(("qk_norm_rope_kv", {"B": m, "nh": nh, "nkv": nkv, "D": d},
                    lambda a=(qkv, wq, cos, sin, 1e-6, kc, vc, pos, nh, nkv): qk_norm_rope_kv.qk_norm_rope_kv(*a),
                    lambda a=(qkv, wq, cos, sin, 1e-6, kc, vc, pos, nh, nkv): qk_norm_rope_kv.reference(*a)))
        q = torch.randn(m, nh, d, device=dev, dtype=dt)
        for w in (16, 256, 1024, 2048):
            bias = torch.zeros(w, device=dev, dtype=dt)
            for bn in ((16,) if w == 16 else (32, 64)):
                out.append(("attention", {"B": m, "W": w, "block_n": bn},
                            lambda a=(q, kc, vc, bias, d ** -0.5), bn=bn, w=w: attention.attention(*a, block_n=bn,
                                                                                                  chunk=w),
                            lambda a=(q, kc, vc, bias, d ** -0.5): attention.reference(*a)))
            if w > 16:  # the split-KV path at the plan's chunk (what the talker runs)
                out.append(("attention", {"B": m, "W": w, "split": True},
                            lambda a=(q, kc, vc, bias, d ** -0.5): attention.attention(*a),
                            lambda a=(q, kc, vc, bias, d ** -0.5): attention.reference(*a)))
        for vocab, k, p in ((3072, 50, 1.0), (2048, 50, 1.0), (2048, 50, 0.9), (2048, 0, 0.95)):
            lg, st = selftest.sampling_case(dev, m, vocab, 0, top_k=k, top_p=p)
            keys = torch.arange(m, device=dev)
            step = torch.tensor([3], device=dev)
            first = torch.zeros(m, vocab, dtype=torch.bool, device=dev)
            first[:, 0] = True
            from engine import sampling

            def ref(lg=lg, st=st, keys=keys, step=step, vocab=vocab, first=first):
                u = sampling.uniforms(keys, step.reshape(()), 1, vocab)
                return sample.choose(lg, *st, u, first)

            out.append(("sample", {"B": m, "V": vocab, "top_k": k, "top_p": p},
                        lambda lg=lg, st=st, keys=keys, step=step: sample.sample(lg, *st, keys=keys, step=step, slot=1),
                        ref))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for kernel_bench_<dtype>.json")
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--linear-sweep", action="store_true", help="only sweep linear launch configurations")
    ap.add_argument("--linear-grid", default="base", choices=list(GRIDS),
                    help="--linear-sweep configurations: base (FMA and 16/32-column tensor-core tiles) or wide "
                         "(tensor-core tiles up to 128 columns, swapped operands, warps)")
    ap.add_argument("--jobs", type=int, default=0, help="--linear-sweep: compile the kernels first in this many "
                                                         "processes")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="row counts for --linear-sweep / --attention")
    ap.add_argument("--attention", action="store_true",
                    help="only the talker attention: torch against the Triton kernel's launch shapes")
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 512, 1024, 2048], help="windows for --attention")
    args = ap.parse_args()
    ok, why = kernels.available("cuda")
    if not ok:
        sys.exit(f"kernel_bench needs the Triton kernels on CUDA: {why}")
    dt, dev = DTYPES[args.dtype], "cuda"
    if args.linear_sweep:
        rows = linear_sweep(dt, dev, args.reps, args.rows, args.linear_grid, args.jobs)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tag = "" if args.rows == [1, 16] else "_rows" + "_".join(map(str, args.rows))
        tag += "" if args.linear_grid == "base" else f"_{args.linear_grid}"
        write_json(out / f"linear_sweep_{args.dtype}{tag}.json", rows)
        return
    if args.attention:
        rows = attention_sweep(dt, dev, args.reps, args.rows, args.windows)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
                "triton": __import__("triton").__version__, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                "method": "median of graph replays, 50 calls per graph, cache copies rotated past L2"}
        path = out / f"attention_sweep_{args.dtype}.json"
        write_json(path, {"meta": meta, "results": rows})
        print(f"wrote {path}")
        return
    rows = []
    for name, shape, fn, ref in cases(dt, dev):
        t_k = graph_time_us(fn, reps=args.reps)
        t_r = graph_time_us(ref, reps=args.reps)
        rows.append(dict(kernel=name, **shape, triton_us=round(t_k, 2), torch_us=round(t_r, 2),
                         speedup=round(t_r / t_k, 2)))
        print(f"{name:16s} {json.dumps(shape):50s} triton {t_k:8.2f} us   torch {t_r:8.2f} us   x{t_r / t_k:5.2f}",
              flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
                "triton": __import__("triton").__version__, "python": platform.python_version(),
                "when": time.strftime("%Y-%m-%d %H:%M:%S"), "method": "median of graph replays, 50 calls per graph"}
    path = out / f"kernel_bench_{args.dtype}.json"
    write_json(path, {"meta": meta, "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
