"""Skinny linear layers for decode (M = 1..16 rows) with their neighbours fused in: one launch for

    y = [res +] prologue(x) @ W^T [+ bias]

where the prologue is nothing, an RMSNorm over the row (norm weight applied), or SwiGLU of a merged
gate/up row (x = [gate | up], 2K wide). It replaces, per decoder layer, rms_norm + qkv matmul,
o_proj addmm (its copy of the residual and cuBLAS's split-K reduce), rms_norm + gate/up matmul and
silu_mul + down addmm: cuBLAS runs these M = 1 shapes far below HBM bandwidth, because few output columns
leave most SMs idle.

Work split: each program owns BLOCK_N output columns and a run of K; when there are few columns the
K range is split over several programs (split-K). Their fp32 partials go to a workspace, and the
program that arrives last at a per-column-block counter adds them in a fixed order (deterministic)
and applies the epilogue, then re-arms the counter for the next launch (graph replays included).

Numerics follow the torch reference: the RMSNorm rounds the normalised row to x.dtype before the
weight, and the weighted row again; SiLU rounds to x.dtype before the product with up; the matmul
accumulates in fp32 (true fp32 for fp32 inputs, no TF32); bias and residual are added to the fp32
sum, rounded once, as cuBLAS's addmm epilogue does.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import counters as arrivals
from . import emulate_rne, interpreting
from ._util import require, sm_count
from .linear_plan import (CONFIG, FMA_ROWS, SWIGLU_IN_DOT_MAX_K, defers_here, norm_steps, one_tile_row, plan,
                          unrolled_splits)
from .pdl import launch_options
from .silu_mul import silu_mul
from .split_sum import SplitSum

__all__ = ["CONFIG", "FMA_ROWS", "MAX_ROWS", "PROLOGUES", "SWIGLU_IN_DOT_MAX_K", "apply_prologue", "exact", "linear",
           "norm_steps", "one_tile_row", "plan", "reference", "unrolled_splits"]

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _round = _rms_apply = _x_tile = _x_input = _sum_sq = _mma = _act = _finish = _pdl_enter = None

PROLOGUES = {"none": 0, "rms_norm": 1, "silu_mul": 2}
MAX_ROWS = 64


def apply_prologue(x, prologue="none", norm_weight=None, eps=1e-6):
    """The prologue in torch, rounding where the kernel rounds."""
    if prologue == "rms_norm":
        return F.rms_norm(x, (x.shape[-1],), eps=eps) * norm_weight
    if prologue == "silu_mul":
        inter = x.shape[-1] // 2
        return F.silu(x[..., :inter]) * x[..., inter:]
    if prologue != "none":
        raise ValueError(f"prologue must be one of {tuple(PROLOGUES)} (got {prologue!r})")
    return x


def reference(x, weight, *, prologue="none", norm_weight=None, eps=1e-6, bias=None, residual=None,
              spend_residual=False):
    """The torch ops this kernel replaces (the off path). On CUDA, cuBLAS adds bias and residual to the
    fp32 sum and rounds once, like the kernel; CPU bf16 addmm may round twice. spend_residual: the caller reads
    the residual no more, so a contiguous one without a bias takes the result in place (the same sums, without
    addmm's copy of it first)."""
    x = apply_prologue(x, prologue, norm_weight, eps)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if residual is not None:
        if spend_residual and bias is None and residual.is_contiguous():
            return residual.view(-1, weight.shape[0]).addmm_(x2, weight.t()).view(*lead, -1)
        base = residual.reshape(-1, weight.shape[0])
        if bias is not None:
            base = base + bias
        return torch.addmm(base, x2, weight.t()).view(*lead, -1)
    return F.linear(x2, weight, bias).view(*lead, -1)


def exact(x, weight, *, prologue="none", norm_weight=None, eps=1e-6, bias=None, residual=None):
    """Test oracle: the prologue in x.dtype, then the matmul, bias and residual in fp64, rounded once."""
    a = apply_prologue(x, prologue, norm_weight, eps).double()
    y = a @ weight.double().t()
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = y + residual.double().reshape(y.shape)
    return y.to(x.dtype)


@functools.cache
def _kernel():
    global triton, tl, _round, _rms_apply, _x_tile, _x_input, _sum_sq, _mma, _act, _finish, _pdl_enter
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()

    @triton.jit
    def _round(x, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """fp32 -> dt, round to nearest even. The interpreter's fp32 -> bf16 cast truncates, so there the
        rounding is done on the bits first (the cast of an exact bf16 value is then exact)."""
        if EMULATE_RNE:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
        return x.to(dt)

    @triton.jit
    def _rms_apply(a, rinv, nw_ptr, rk, k_ok, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Normalised row (rounded to dt) times the norm weight (rounded again), as the torch RMSNorm."""
        a = _round(a.to(tl.float32) * rinv[:, None], dt, EMULATE_RNE).to(tl.float32)
        nw = tl.load(nw_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
        return _round(a * nw[None, :], dt, EMULATE_RNE)

    @triton.jit
    def _x_tile(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, rm, m_ok, rk, k_ok, M, K, XS: tl.constexpr,
                dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """A [rows, BLOCK_K] tile of the input: loaded, or with XS > 0 made from a deferred split-K sum
        (split_sum.py): XS fp32 partials [XS, M, K] added in split order from +0.0, then the residual, rounded
        once, as linear's `_finish` does."""
        mask = m_ok[:, None] & k_ok[None, :]
        if XS == 0:
            return tl.load(x_ptr + rm[:, None] * stride_x + rk[None, :], mask=mask, other=0.0)
        at = rm[:, None] * K + rk[None, :]
        acc = tl.zeros(at.shape, tl.float32)
        for sp in tl.static_range(XS):
            acc += tl.load(xp_ptr + sp * M * K + at, mask=mask, other=0.0)
        acc += tl.load(xr_ptr + rm[:, None] * stride_xr + rk[None, :], mask=mask, other=0.0).to(tl.float32)
        return _round(acc, dt, EMULATE_RNE)

    @triton.jit
    def _x_input(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, xo_ptr, keep_x, rm, m_ok, rk, k_ok, M, K,
                 XS: tl.constexpr, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """`_x_tile`, and with a deferred input (XS > 0) the programs that keep_x also store the tile they made
        into xo_ptr (rows of K, like the partials): the row later launches take as their residual."""
        a = _x_tile(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, rm, m_ok, rk, k_ok, M, K, XS, dt, EMULATE_RNE)
        if XS > 0:
            if keep_x:
                tl.store(xo_ptr + rm[:, None] * K + rk[None, :], a, mask=m_ok[:, None] & k_ok[None, :])
        return a

    @triton.jit
    def _sum_sq(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, rm, m_ok, k0, M, K, BLOCK_K: tl.constexpr,
                XS: tl.constexpr, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Each row's sum of squares over columns k0 .. k0 + BLOCK_K (those below K), in fp32: [rows]."""
        rk = k0 + tl.arange(0, BLOCK_K)
        xv = _x_tile(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, rm, m_ok, rk, rk < K, M, K, XS, dt,
                     EMULATE_RNE).to(tl.float32)
        return tl.sum(xv * xv, axis=1)

    @triton.jit
    def _mma(acc, a, w, USE_DOT: tl.constexpr, IEEE: tl.constexpr, SWAP_AB: tl.constexpr):
        """acc [rows, BLOCK_N] += a [rows, BLOCK_K] @ w [BLOCK_N, BLOCK_K]^T; with SWAP_AB the transposed
        product, acc [BLOCK_N, rows] += w @ a^T (the weight tile is the MMA's M side, the rows its N side)."""
        if SWAP_AB:
            if IEEE:
                acc += tl.dot(w.to(tl.float32), tl.trans(a).to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(w, tl.trans(a))
        elif USE_DOT:  # tensor cores; rows padded to 16
            if IEEE:  # fp32 inputs (or the interpreter, whose numpy dot has no bf16): exact fp32 products
                acc += tl.dot(a.to(tl.float32), tl.trans(w).to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(a, tl.trans(w))
        else:  # a few rows: plain FMAs over [rows, BLOCK_N, BLOCK_K], no padding
            acc += tl.sum(a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        return acc

    @triton.jit
    def _act(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, xo_ptr, keep_x, rm, m_ok, rk, k_ok, M, K, rinv, nw_ptr,
             PROLOGUE: tl.constexpr, XS: tl.constexpr, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """One [rows, BLOCK_K] tile of the prologue's output (its input by `_x_input`)."""
        xmask = m_ok[:, None] & k_ok[None, :]
        if PROLOGUE == 2:
            xp = x_ptr + rm[:, None] * stride_x + rk[None, :]
            g = tl.load(xp, mask=xmask, other=0.0).to(tl.float32)
            u = tl.load(xp + K, mask=xmask, other=0.0).to(tl.float32)
            s = _round(g / (1.0 + tl.exp(-g)), dt, EMULATE_RNE).to(tl.float32)
            a = _round(s * u, dt, EMULATE_RNE)
        else:
            a = _x_input(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, xo_ptr, keep_x, rm, m_ok, rk, k_ok, M, K, XS, dt,
                         EMULATE_RNE)
            if PROLOGUE == 1:
                a = _rms_apply(a, rinv, nw_ptr, rk, k_ok, dt, EMULATE_RNE)
        return a

    @triton.jit
    def _finish(acc, rm, rn, m_ok, n_ok, M, N, pid_n, pid_k, splits, part_ptr, count_ptr, y_ptr, stride_y,
                res_ptr, stride_r, bias_ptr, RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, SP: tl.constexpr, EMULATE_RNE: tl.constexpr, DEFER: tl.constexpr):
        """The epilogue of a split-K program with partial acc [BLOCK_M, BLOCK_N] (split pid_k of `splits`):
        the splits' fp32 partials meet at column block pid_n's counter, the last arrival sums them in a fixed
        order (deterministic), adds bias and residual to the fp32 sum, stores y rounded once, and re-arms the
        counter for the next launch (graph replays included). DEFER: only the partial is stored; the next
        launch makes the sum (split_sum.py, `_x_tile`).
        SP >= splits (0: no bound known): the sum is unrolled SP times, so the partials' loads go out
        together instead of one L2 round trip after another (same order, the same bits: adding a masked
        +0.0 changes no sum that starts from +0.0)."""
        dt = y_ptr.dtype.element_ty
        out_mask = m_ok[:, None] & n_ok[None, :]
        last = splits == 1
        if DEFER:
            tl.store(part_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=out_mask)
            last = False
        elif splits > 1:
            tile = rm[:, None] * N + rn[None, :]
            tl.store(part_ptr + pid_k * M * N + tile, acc, mask=out_mask)
            tl.debug_barrier()  # every thread's partial is written before the counter moves
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            last = arrived == splits - 1
            if last:  # fixed summation order, whoever arrives last
                acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                if SP > 0:
                    for sp in tl.static_range(SP):
                        live = out_mask & ((tile * 0 + sp) < splits)
                        acc += tl.load(part_ptr + sp * M * N + tile, mask=live, other=0.0, cache_modifier=".cg")
                else:
                    for sp in range(splits):
                        acc += tl.load(part_ptr + sp * M * N + tile, mask=out_mask, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(count_ptr + pid_n, 0)  # re-arm for the next launch
        if last:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if RESIDUAL:
                acc += tl.load(res_ptr + rm[:, None] * stride_r + rn[None, :], mask=out_mask,
                               other=0.0).to(tl.float32)
            tl.store(y_ptr + rm[:, None] * stride_y + rn[None, :], _round(acc, dt, EMULATE_RNE), mask=out_mask)

    @triton.jit
    def linear_kernel(x_ptr, stride_x, w_ptr, stride_w, y_ptr, stride_y, res_ptr, stride_r,
                      nw_ptr, bias_ptr, part_ptr, count_ptr, xp_ptr, xr_ptr, stride_xr, xo_ptr,
                      M, N, K, eps, chunk,
                      PROLOGUE: tl.constexpr, RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                      USE_DOT: tl.constexpr, IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr, ONE_TILE: tl.constexpr,
                      SWAP_AB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SP: tl.constexpr, SS_STEPS: tl.constexpr, XS: tl.constexpr, DEFER: tl.constexpr,
                      PDL: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        splits = tl.num_programs(1)
        dt = y_ptr.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = rm < M
        n_ok = rn < N
        if SWAP_AB:
            acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        # The first weight tile is loaded before pdl_enter: weights are never written, so under PDL these
        # bytes stream in while the previous kernel finishes.
        k_start = pid_k * chunk
        k_end = tl.minimum(k_start + chunk, K)
        rk = k_start + tl.arange(0, BLOCK_K)
        k_ok = rk < k_end
        w = tl.load(w_ptr + rn[:, None] * stride_w + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        _pdl_enter(PDL)
        tl.static_assert(XS == 0 or PROLOGUE != 2, "a deferred sum feeds the plain and RMSNorm prologues")
        keep_x = pid_n == 0  # column block 0 stores a deferred input's row (split_sum.py)
        if ONE_TILE:  # all of K in this tile (one program per column block)
            a = _x_input(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, xo_ptr, keep_x, rm, m_ok, rk, k_ok, M, K, XS, dt,
                         EMULATE_RNE)
            if PROLOGUE == 1:
                af = a.to(tl.float32)
                rinv = tl.rsqrt(tl.sum(af * af, axis=1) / K + eps)
                a = _rms_apply(a, rinv, nw_ptr, rk, k_ok, dt, EMULATE_RNE)
            acc = _mma(acc, a, w, USE_DOT, IEEE, SWAP_AB)
        else:
            rinv = tl.zeros([BLOCK_M], tl.float32)
            if PROLOGUE == 1:  # RMS of each full row (every program recomputes it: M x K from L2 is cheap)
                ss = tl.zeros([BLOCK_M], tl.float32)
                if SS_STEPS > 0:  # unrolled: the row's loads go out together, not one L2 round trip per step
                    for i in tl.static_range(SS_STEPS):
                        ss += _sum_sq(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, rm, m_ok, i * BLOCK_K, M, K, BLOCK_K,
                                      XS, dt, EMULATE_RNE)
                else:
                    for k0 in range(0, K, BLOCK_K):
                        ss += _sum_sq(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, rm, m_ok, k0, M, K, BLOCK_K, XS, dt,
                                      EMULATE_RNE)
                rinv = tl.rsqrt(ss / K + eps)
            a = _act(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, xo_ptr, keep_x, rm, m_ok, rk, k_ok, M, K, rinv,
                     nw_ptr, PROLOGUE, XS, dt, EMULATE_RNE)
            acc = _mma(acc, a, w, USE_DOT, IEEE, SWAP_AB)
            for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_ok = rk < k_end
                a = _act(x_ptr, stride_x, xp_ptr, xr_ptr, stride_xr, xo_ptr, keep_x, rm, m_ok, rk, k_ok, M, K, rinv,
                         nw_ptr, PROLOGUE, XS, dt, EMULATE_RNE)
                w = tl.load(w_ptr + rn[:, None] * stride_w + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                            other=0.0)
                acc = _mma(acc, a, w, USE_DOT, IEEE, SWAP_AB)
        if SWAP_AB:
            acc = tl.trans(acc)
        _finish(acc, rm, rn, m_ok, n_ok, M, N, pid_n, pid_k, splits, part_ptr, count_ptr, y_ptr, stride_y,
                res_ptr, stride_r, bias_ptr, RESIDUAL, HAS_BIAS, BLOCK_M, BLOCK_N, SP, EMULATE_RNE, DEFER)

    return linear_kernel


def linear(x, weight, *, prologue="none", norm_weight=None, eps=1e-6, bias=None, residual=None,
           config=None, target=None, pdl=False, counters=None, defer=False, plan_rows=None):
    """x [..., K] (or [..., 2K] for silu_mul) with rows contiguous; weight [N, K] row-major -> [..., N].

    Same contract as `reference`; rows beyond MAX_ROWS fall back to it (decode never has them).
    x may also be a SplitSum (split_sum.py) left by a deferred launch, for the "none" and "rms_norm" prologues:
    the kernel makes the row from its partials and stores it in x.out.
    defer: where the launch splits K, leave its sum to the next linear: returns a SplitSum (needs a residual and
    no bias); an unsplit launch returns its tensor as usual.
    pdl: launch with programmatic dependent launch (engine/kernels/pdl.py; the caller checked support).
    counters: the engine's arrival counters (counters.py; None: the shared set).
    plan_rows: plan the launch as for this many rows (at least the rows given; None: as many as given). With one
    value for every call, each row's result is the same bits whatever the other rows (Kernels.plan_rows)."""
    code = PROLOGUES[prologue]
    n, k = weight.shape
    deferred = isinstance(x, SplitSum)
    if deferred:
        require(code != 2 and x.residual.stride(-1) == 1 and x.out.is_contiguous(),
                "a deferred sum feeds the plain or RMSNorm prologue, its residual and out rows contiguous")
        x_in, x = x, x.out  # x.out: the shape, and the row the kernel stores
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    require(not deferred or m <= MAX_ROWS, f"a deferred sum of more than {MAX_ROWS} rows")
    if m > MAX_ROWS:
        return reference(x, weight, prologue=prologue, norm_weight=norm_weight, eps=eps, bias=bias,
                         residual=residual)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    require(weight.stride(-1) == 1, "weight rows must be contiguous")
    require(x2.shape[1] == (2 * k if code == 2 else k),
            f"input {tuple(x.shape)} for weight {tuple(weight.shape)}, {prologue}")
    require(plan_rows is None or m <= plan_rows <= MAX_ROWS, f"plan_rows between the rows and {MAX_ROWS}")
    p = plan(plan_rows or m, n, k, config, target, sm_count(x.device), prologue)
    if code == 2 and p["PROLOGUE"] == "none":
        # A long SwiGLU on the tensor-core path (SWIGLU_IN_DOT_MAX_K): its own launch, then the matmul here.
        x2, code = silu_mul(x2, pdl=pdl), 0
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res = residual.reshape(m, n) if residual is not None else y
    split = p["splits"] > 1
    part = torch.empty(p["splits"], m, n, dtype=torch.float32, device=x.device) if split else y
    defer = defer and split and defers_here(p, n)
    if defer:
        require(residual is not None and bias is None and res.stride(-1) == 1,
                "a deferred sum needs a residual (rows contiguous) and no bias")
    require(not deferred or not p["USE_DOT"], "a deferred sum feeds the FMA path only (rows <= FMA_ROWS)")
    counters = arrivals.of(counters, "linear", x.device)
    require(p["n_blocks"] <= counters.numel(), "split-k counters for every block")
    key = (x.device, x.dtype, p["BLOCK_M"], n, k, code, p["BLOCK_N"], p["BLOCK_K"], p["SWAP_AB"], residual is not None,
           bias is not None, deferred, defer)
    _fitting(key, p["num_stages"], lambda stages: _kernel()[(p["n_blocks"], p["splits"])](
        x2, x2.stride(0), weight, weight.stride(0), y, y.stride(0), res, res.stride(0),
        norm_weight if norm_weight is not None else y, bias if bias is not None else y, part, counters,
        *((x_in.part, x_in.residual, x_in.residual.reshape(m, k).stride(0), x2) if deferred else (y, y, 0, y)),
        m, n, k, float(eps), p["chunk"],
        PROLOGUE=code, RESIDUAL=residual is not None, HAS_BIAS=bias is not None, USE_DOT=p["USE_DOT"],
        IEEE=x.dtype == torch.float32 or interpreting(), EMULATE_RNE=emulate_rne(x.dtype),
        ONE_TILE=p["splits"] == 1 and k <= p["BLOCK_K"] and code != 2, SWAP_AB=p["SWAP_AB"],
        BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], BLOCK_K=p["BLOCK_K"], SP=unrolled_splits(p["splits"]),
        SS_STEPS=norm_steps(k, p["BLOCK_K"], p["BLOCK_M"]) if code == 1 else 0,
        XS=x_in.splits if deferred else 0, DEFER=defer,
        num_warps=p["num_warps"], num_stages=stages, **launch_options(pdl)))
    if defer:
        return SplitSum(part, res, y.view(*lead, n))
    return y.view(*lead, n)


# Pipeline stages that fit the device's shared memory, per launch shape (see _fitting).
_STAGES: dict = {}


def _fitting(key, stages: int, launch) -> None:
    """launch(num_stages) with the plan's stages, or fewer where the tile's pipeline does not fit the device's
    shared memory (a [64 rows, 2 x 256] SwiGLU tile in 3 stages needs 256 KB, an H100 has 227; an fp32 one at
    32 rows, 288). Triton refuses such a launch before it runs, so a retry with a stage less is safe; the
    stages change only how far the loads run ahead, not the result. The count that fits is kept per shape."""
    from triton.runtime.errors import OutOfResources

    stages = _STAGES.get(key, stages)
    while True:
        try:
            launch(stages)
        except OutOfResources:
            if stages <= 1:
                raise
            stages -= 1
            _STAGES[key] = stages
            continue
        return
