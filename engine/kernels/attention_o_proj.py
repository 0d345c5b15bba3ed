"""A decode token's attention and o_proj in one launch, for short windows (the code predictor's 16
positions) and one or two rows (replaces qk_norm_rope_kv, attention and the o_proj linear: 3 launches).

    y = residual + attention(q/k norm + RoPE of qkv, caches with this token's k / v at pos) @ Wo^T

Why: at one take a predictor layer's attention is two tiny launches in a chain of six, each paying a
kernel boundary. Here the o_proj's split-K programs make their own attention input instead.

Work split: grid (column blocks of Wo, kv heads). The program of kv head h owns the K slice of Wo that
h's G query heads feed (G x D columns); it preloads that weight tile before the PDL wait (weights are never
written), then for each row makes the G query heads and h's key (q/k RMSNorm + RoPE from the qkv row, as
qk_norm_rope_kv), attends over the window, rounds the output to the activation dtype (as the attention
kernel stores it) and multiplies it into its tile. The window's other positions come from the caches;
position pos takes the token's own k / v from registers, so no program waits for another's cache write.
The programs of column block 0 write the token's k / v into the caches (for the next tokens). The splits'
partials meet as in linear.py (`_finish`): the last arrival sums them in a fixed order and adds the residual.

Each kv head's attention is recomputed by every column block (window x D x 2 values from L2 a program,
about the size of its weight tile), which is cheaper than the launches it replaces.

Numerics as the three launches: q/k norm and RoPE round as qk_norm_rope_kv; scores and the scaled bias
add are rounded to the dtype, softmax in fp32 with unrounded probabilities, the output rounded to the
dtype (attention.py); the product accumulates in fp32 and the residual is added before one rounding.
"""
from __future__ import annotations

import functools

import torch

from . import attention as ka
from . import counters as arrivals
from . import emulate_rne
from . import linear as kl
from . import qk_norm_rope_kv as kq
from ._util import next_pow2, require
from .pdl import launch_options
from .split_sum import SplitSum

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _pdl_enter = _round = _heads_norm_rope = _token_kv = _live_row = _put_kv = _attend_window = _finish = None

# The launch runs rows up to MAX_ROWS (the linear kernel's FMA rows; above, the tensor-core paths win and
# the attention work per program grows with rows) and windows up to MAX_WINDOW (the whole window is one
# tile; the talker's long windows keep the split-KV kernel). Kernels.attention_o_proj uses it where `fits`:
# up to FUSE_ROWS rows (at 2 rows each program makes both rows' attention one after the other, slower than
# the three launches).
MAX_ROWS = kl.FMA_ROWS
FUSE_ROWS = 1
MAX_WINDOW = 64
# Column block and warps: the fastest in whole-frame graph timings. 64 columns make 16 column blocks x 8 kv
# heads = 128 programs, one wave on an H100.
CONFIG = {"BLOCK_N": 64, "num_warps": 8}


def reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv, weight,
              residual):
    """The ops this kernel replaces: rope_attention (writes the caches at pos), then o_proj with the
    residual added -> [B, 1, N]."""
    b = qkv.shape[0]
    out = ka.rope_reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv)
    return kl.reference(out.reshape(b, 1, nh * k_cache.shape[-1]), weight, residual=residual)


def fits(rows: int, window: int) -> bool:
    return rows <= FUSE_ROWS and window <= MAX_WINDOW


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter, _round, _heads_norm_rope, _token_kv, _live_row, _put_kv, _attend_window, _finish
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()
    ka._kernel()  # binds the helpers of linear and qk_norm_rope_kv too
    _round, _finish, _attend_window = kl._round, kl._finish, ka._attend_window
    _heads_norm_rope, _token_kv, _live_row, _put_kv = kq._heads_norm_rope, kq._token_kv, kq._live_row, kq._put_kv

    @triton.jit
    def attention_o_proj_kernel(qkv_ptr, stride_qkv, qkn_ptr, cos_ptr, sin_ptr, stride_cos, pos_ptr, stride_pos,
                                eps, k_ptr, v_ptr, skb, skh, sks, svb, svh, svs, bias_ptr, stride_bias, W, scale,
                                w_ptr, stride_w, res_ptr, stride_r, y_ptr, stride_y, part_ptr, count_ptr, M, N,
                                NH: tl.constexpr, NKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_W: tl.constexpr, SP: tl.constexpr, EMULATE_RNE: tl.constexpr,
                                DEFER: tl.constexpr, PDL: tl.constexpr):
        pid_n = tl.program_id(0)
        h = tl.program_id(1)  # kv head, and the split of K this program sums
        dt = y_ptr.dtype.element_ty
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        gi = tl.arange(0, GP)
        g_ok = gi < G
        di = tl.arange(0, D)
        # Wo columns of h's query heads as [BLOCK_N, GP, D], loaded before the wait (see pdl.py)
        wt = tl.load(w_ptr + rn[:, None, None] * stride_w + ((h * G + gi) * D)[None, :, None] + di[None, None, :],
                     mask=n_ok[:, None, None] & g_ok[None, :, None], other=0.0).to(tl.float32)
        _pdl_enter(PDL)
        rm = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        wi = tl.arange(0, BLOCK_W)
        w_ok = wi < W
        rot = (di + D // 2) % D
        for r in range(M):
            pos = tl.load(pos_ptr + r * stride_pos)
            # the window's cached keys / values, issued first: they do not depend on this row's math
            kc = tl.load(k_ptr + r * skb + h * skh + wi[:, None] * sks + di[None, :], mask=w_ok[:, None], other=0.0)
            vc = tl.load(v_ptr + r * svb + h * svh + wi[:, None] * svs + di[None, :], mask=w_ok[:, None], other=0.0)
            bias = tl.load(bias_ptr + r * stride_bias + wi, mask=w_ok, other=float("-inf")).to(tl.float32)
            c = tl.load(cos_ptr + r * stride_cos + di).to(tl.float32)
            s = tl.load(sin_ptr + r * stride_cos + di).to(tl.float32)
            row = qkv_ptr + r * stride_qkv
            q = _heads_norm_rope(row, qkn_ptr, h * G + gi, g_ok, di, rot, c, s, eps, D, dt, EMULATE_RNE)
            k2, v2, live = _token_kv(row, qkn_ptr, h, di, rot, c, s, eps, NH, NKV, D, dt, EMULATE_RNE)
            if pid_n == 0:  # one program per kv head keeps the token's k / v for the next tokens
                _put_kv(k_ptr + r * skb + h * skh + pos * sks, v_ptr + r * svb + h * svh + pos * svs, k2, v2, live,
                        di)
            here = (wi == pos)[:, None]
            k = tl.where(here, _live_row(k2, live)[None, :], kc.to(tl.float32))
            v = tl.where(here, _live_row(v2, live)[None, :], vc.to(tl.float32))
            out = _attend_window(q.to(tl.float32), k, v, bias, scale, dt, EMULATE_RNE)  # [GP, D]
            out = _round(out, dt, EMULATE_RNE).to(tl.float32)
            part = tl.sum(tl.sum(wt * out[None, :, :], axis=2), axis=1)  # [BLOCK_N]
            acc = tl.where(rm[:, None] == r, acc + part[None, :], acc)
        _finish(acc, rm, rn, rm < M, n_ok, M, N, pid_n, h, NKV, part_ptr, count_ptr, y_ptr, stride_y,
                res_ptr, stride_r, y_ptr, True, False, BLOCK_M, BLOCK_N, SP, EMULATE_RNE, DEFER)

    return attention_o_proj_kernel


def attention_o_proj(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv, weight,
                     residual, pdl=False, config=None, counters=None, defer=False):
    """Same arguments and result as `reference` (qkv [B, (nh + 2 nkv) * D] or [B, 1, ...]; pos one position
    or one per row, cos / sin and bias to match; weight [N, nh * D]; residual [B, 1, N]) -> [B, 1, N].
    Needs fits(B, window); config overrides CONFIG; counters: the engine's arrival counters (counters.py).
    defer: the kv heads' partials are left for the next linear to sum: returns a SplitSum (split_sum.py), where
    there are several (nkv > 1) and the next linear takes the row in one tile (linear.one_tile_row)."""
    cfg = {**CONFIG, **(config or {})}
    b = qkv.shape[0]
    window = bias.shape[-1]
    require(b <= MAX_ROWS and window <= MAX_WINDOW,
            f"attention_o_proj runs {MAX_ROWS} rows and windows of {MAX_WINDOW} positions at most")
    qkv2, cos, sin_signed, d = kq._inputs(qkv, qk_norm_weight, cos, sin_signed, k_cache, v_cache, nh, nkv)
    per_row = kq._rows_at_own_positions(b, pos, cos, sin_signed)
    require(nkv == k_cache.shape[1] and nh % nkv == 0, "the caches hold nkv heads, each for nh / nkv query heads")
    require(bias.is_contiguous() and (bias.dim() == 1 or bias.shape[0] in (1, b)), "bias [W] or [B, 1, 1, W]")
    n = weight.shape[0]
    require(weight.shape[1] == nh * d and weight.stride(-1) == 1, "o_proj weight [N, nh * D], rows contiguous")
    res = residual.reshape(b, n)
    require(res.stride(-1) == 1, "contiguous residual rows")
    block_n = cfg["BLOCK_N"]
    n_blocks = -(-n // block_n)
    defer = defer and nkv > 1 and kl.one_tile_row(n)
    counters = arrivals.of(counters, "linear", qkv.device)
    require(n_blocks <= counters.numel(), "split-k counters for every block")
    y = torch.empty(b, n, dtype=qkv.dtype, device=qkv.device)
    part = torch.empty(nkv, b, n, dtype=torch.float32, device=qkv.device)
    g = nh // nkv
    _kernel()[(n_blocks, nkv)](
        qkv2, qkv2.stride(0), qk_norm_weight, cos, sin_signed, d if per_row else 0, pos, 1 if per_row else 0,
        float(eps), k_cache, v_cache, *k_cache.stride()[:3], *v_cache.stride()[:3],
        bias, ka.bias_row_stride(bias, b), window, float(scale),
        weight, weight.stride(0), res, res.stride(0), y, y.stride(0), part, counters, b, n,
        NH=nh, NKV=nkv, G=g, GP=max(next_pow2(g), 1), D=d, BLOCK_M=next_pow2(b), BLOCK_N=block_n,
        BLOCK_W=max(next_pow2(window), 2), SP=kl.unrolled_splits(nkv),
        EMULATE_RNE=emulate_rne(qkv.dtype), DEFER=bool(defer), num_warps=cfg["num_warps"],
        **launch_options(pdl))
    if defer:
        return SplitSum(part, res, y.view(b, 1, n))
    return y.view(b, 1, n)
