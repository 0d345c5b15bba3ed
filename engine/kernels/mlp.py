"""A decoder layer's MLP for one or two decode rows in one launch (two with linear.py):

    y = x + down_proj( silu(gate) * up ),   [gate | up] = rms_norm(x) @ Wgu^T

Why: at one take a frame is a chain of ~550 launches, and each boundary costs a few microseconds that are
not bytes (issue 14). Between the gate/up and the down matmul there is no reason for one: a program that
owns some intermediate columns can make them and multiply them into the down weight's columns they feed.

Work split: program p owns BI intermediate columns. It loads their gate and up rows (the first K block
before the PDL wait: weights are never written), makes rms_norm(x) and the BI gate / up values, rounded to
the dtype as the gate/up linear stores them, SwiGLU rounded as linear.py's prologue, and the product with
its BI columns of Wdown: a partial [rows, H] of the whole output, in fp32. The partials meet like split-K
partials, except that every program holds a piece of every output column, so the last C programs to arrive
each sum one block of H / C columns over all P partials, in a fixed order (deterministic), add the residual
and round once. Such a program first waits for the at most C - 1 programs still computing; they are never
starved of an SM by the waiters (C is at most half the SMs, and the next launch cannot start its programs
before all of these have started). The interpreter runs programs one after another, so there C = 1: only the
last arrival sums, and it has nothing to wait for.

Status (bench/results/mlp_h100.md, H100): correct, deterministic, 108 launches a frame fewer, but slower: a
0.6B frame 2.835 -> 4.012 ms at one take. The sum can start only when every program has arrived, which costs
what the boundary cost, and each program streams 96 KB instead of 16. So it is opt-in (QWEN3TTS_FUSED_MLP=1,
engine/kernels).

Numerics as the two linear launches: RMSNorm rounded as linear.py, fp32 sums, gate / up rounded to the
dtype, SiLU and the product rounded as the silu_mul prologue, the down sum in fp32 with the residual added
before one rounding. Only the fp32 summation order differs (the down sum runs over P partials of BI terms).
"""
from __future__ import annotations

import functools

import torch

from . import counters as arrivals
from . import emulate_rne, interpreting
from . import linear as kl
from ._util import next_pow2, require, sm_count
from .pdl import launch_options

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _pdl_enter = _round = _rms_apply = _mma = None

FUSE_ROWS = kl.FMA_ROWS  # the FMA rows; above, the tensor-core linears run
# BI: intermediate columns a program owns (16 bf16 = one 32-byte sector of each Wdown row it reads).
# CW: output columns a summing program owns. TILE: elements of a weight tile in registers.
CONFIG = {"BI": 16, "CW": 32, "TILE": 8192, "num_warps": 8, "PRELOAD_DOWN": False}
PARTIALS_PER_ROUND = 128  # a summing program loads this many partials per round


def reference(x, gate_up, norm_weight, eps, down):
    """The two linear launches this kernel replaces (each as its torch reference)."""
    gu = kl.reference(x, gate_up, prologue="rms_norm", norm_weight=norm_weight, eps=eps)
    return kl.reference(gu, down, prologue="silu_mul", residual=x)


def fits(rows: int, hidden: int, inter: int, config=None) -> bool:
    cfg = {**CONFIG, **(config or {})}
    return rows <= FUSE_ROWS and hidden == next_pow2(hidden) and inter % cfg["BI"] == 0


def plan(m: int, hidden: int, inter: int, sms: int = 132, config=None, interpreter: bool = False) -> dict:
    """Launch parameters (pure Python, testable without a GPU)."""
    cfg = {**CONFIG, **(config or {})}
    bi = cfg["BI"]
    programs = inter // bi
    if interpreter:
        cw = hidden  # one summing program (see the module doc)
    else:
        cw = max(cfg["CW"], next_pow2(-(-hidden // max(1, sms // 2))))
    cw = min(cw, hidden)
    pp = next_pow2(programs)
    return {"programs": programs, "BI": bi, "BK": min(hidden, max(16, cfg["TILE"] // bi)), "C": hidden // cw,
            "CW": cw, "PP": pp, "PR": min(pp, PARTIALS_PER_ROUND), "BLOCK_M": next_pow2(m),
            "num_warps": cfg["num_warps"], "PRELOAD_DOWN": bool(cfg["PRELOAD_DOWN"])}


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter, _round, _rms_apply, _mma
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()
    kl._kernel()
    _round, _rms_apply, _mma = kl._round, kl._rms_apply, kl._mma

    @triton.jit
    def mlp_kernel(x_ptr, stride_x, nw_ptr, wgu_ptr, wd_ptr, y_ptr, stride_y, part_ptr, count_ptr, M, eps,
                   H: tl.constexpr, I: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, BLOCK_M: tl.constexpr,
                   C: tl.constexpr, CW: tl.constexpr, PP: tl.constexpr, PR: tl.constexpr,
                   PRELOAD_DOWN: tl.constexpr, EMULATE_RNE: tl.constexpr, PDL: tl.constexpr):
        p = tl.program_id(0)
        programs = tl.num_programs(0)
        dt = y_ptr.dtype.element_ty
        ri = p * BI + tl.arange(0, BI)  # this program's intermediate columns
        rk = tl.arange(0, BK)
        wg = tl.load(wgu_ptr + ri[:, None] * H + rk[None, :])
        wu = tl.load(wgu_ptr + (I + ri)[:, None] * H + rk[None, :])
        if PRELOAD_DOWN:
            rd = tl.arange(0, BK)
            wd0 = tl.load(wd_ptr + rd[:, None] * I + ri[None, :])
        _pdl_enter(PDL)
        rm = tl.arange(0, BLOCK_M)
        m_ok = rm < M
        rh = tl.arange(0, H)
        xf = tl.load(x_ptr + rm[:, None] * stride_x + rh[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
        rinv = tl.rsqrt(tl.sum(xf * xf, axis=1) / H + eps)
        g = tl.zeros([BLOCK_M, BI], tl.float32)
        u = tl.zeros([BLOCK_M, BI], tl.float32)
        for k0 in tl.static_range(0, H, BK):
            rk = k0 + tl.arange(0, BK)
            if k0 > 0:
                wg = tl.load(wgu_ptr + ri[:, None] * H + rk[None, :])
                wu = tl.load(wgu_ptr + (I + ri)[:, None] * H + rk[None, :])
            a = tl.load(x_ptr + rm[:, None] * stride_x + rk[None, :], mask=m_ok[:, None], other=0.0)
            a = _rms_apply(a, rinv, nw_ptr, rk, rk < H, dt, EMULATE_RNE)
            g = _mma(g, a, wg, False, False, False)
            u = _mma(u, a, wu, False, False, False)
        g = _round(g, dt, EMULATE_RNE).to(tl.float32)  # the gate/up linear's output
        u = _round(u, dt, EMULATE_RNE).to(tl.float32)
        s = _round(g / (1.0 + tl.exp(-g)), dt, EMULATE_RNE).to(tl.float32)
        h = _round(s * u, dt, EMULATE_RNE)  # [BLOCK_M, BI]: the down matmul's input columns
        base = part_ptr + p * (M * H)
        for d0 in tl.static_range(0, H, BK):
            rd = d0 + tl.arange(0, BK)
            if PRELOAD_DOWN and d0 == 0:
                wd = wd0
            else:
                wd = tl.load(wd_ptr + rd[:, None] * I + ri[None, :])
            part = _mma(tl.zeros([BLOCK_M, BK], tl.float32), h, wd, False, False, False)
            tl.store(base + rm[:, None] * H + rd[None, :], part, mask=m_ok[:, None])
        tl.debug_barrier()  # every thread's partial is written before the count moves
        ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel")
        if ticket >= programs - C:  # one of the last C arrivals: sum column block `ticket - (programs - C)`
            if C > 1:
                seen = tl.load(count_ptr, volatile=True)
                while seen < programs:
                    seen = tl.load(count_ptr, volatile=True)
                tl.atomic_add(count_ptr, 0, sem="acquire")  # the other partials are visible from here
            rc = (ticket - (programs - C)) * CW + tl.arange(0, CW)
            out_ok = m_ok[:, None] & (rc < H)[None, :]
            acc = tl.zeros([BLOCK_M, CW], tl.float32)
            for q0 in tl.static_range(0, PP, PR):  # fixed order: rounds of PR partials, each a fixed tree
                pi = q0 + tl.arange(0, PR)
                parts = tl.load(part_ptr + pi[:, None, None] * (M * H) + rm[None, :, None] * H + rc[None, None, :],
                                mask=(pi < programs)[:, None, None] & out_ok[None, :, :], other=0.0,
                                cache_modifier=".cg")
                acc += tl.sum(parts, axis=0)
            acc += tl.load(x_ptr + rm[:, None] * stride_x + rc[None, :], mask=out_ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + rm[:, None] * stride_y + rc[None, :], _round(acc, dt, EMULATE_RNE), mask=out_ok)
            done = tl.atomic_add(count_ptr + 1, 1, sem="acq_rel")
            if done == C - 1:  # every summing program is past its wait: re-arm for the next launch
                tl.atomic_xchg(count_ptr, 0)
                tl.atomic_xchg(count_ptr + 1, 0)

    return mlp_kernel


def mlp(x, gate_up, norm_weight, eps, down, pdl=False, config=None, counters=None):
    """Same arguments and result as `reference`: x [B, 1, H] or [B, H] (B <= FUSE_ROWS), gate_up [2I, H] and
    down [H, I] row-major -> like x. config overrides CONFIG. counters: the engine's arrival counters
    (counters.py; None: the shared set)."""
    lead = x.shape[:-1]
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    m = x2.shape[0]
    inter = down.shape[1]
    require(fits(m, hidden, inter, config), f"mlp runs up to {FUSE_ROWS} rows of a power-of-two width, "
            f"intermediate width divisible by BI (got {m} x {hidden}, {inter})")
    require(tuple(gate_up.shape) == (2 * inter, hidden) and tuple(down.shape) == (hidden, inter),
            "gate_up [2I, H] and down [H, I]")
    require(gate_up.is_contiguous() and down.is_contiguous() and x2.stride(-1) == 1, "contiguous rows")
    p = plan(m, hidden, inter, sm_count(x.device), config, interpreting())
    require(p["C"] <= p["programs"], "more programs than summing programs")
    y = torch.empty(m, hidden, dtype=x.dtype, device=x.device)
    part = torch.empty(p["programs"], m, hidden, dtype=torch.float32, device=x.device)
    counters = arrivals.of(counters, "mlp", x.device)
    _kernel()[(p["programs"],)](
        x2, x2.stride(0), norm_weight, gate_up, down, y, y.stride(0), part, counters, m, float(eps),
        H=hidden, I=inter, BI=p["BI"], BK=p["BK"], BLOCK_M=p["BLOCK_M"], C=p["C"], CW=p["CW"], PP=p["PP"],
        PR=p["PR"], PRELOAD_DOWN=p["PRELOAD_DOWN"], EMULATE_RNE=emulate_rne(x.dtype),
        num_warps=p["num_warps"], **launch_options(pdl))
    return y.view(*lead, hidden)
