"""q/k RMSNorm + RoPE + KV-cache write of one decode token, in one launch (replaces ~7 kernels); `prefill`
does the same for the T tokens of a fresh prompt (positions 0..T-1 of a batch-1 cache, ~20 kernels).

Input qkv [B, (nh + 2 nkv) * D] is the merged projection (row stride may be larger). One program per
(row, head) over nh + 2 nkv heads: q heads are normalised, rotated and written to q [B, nh, D]; k heads
are normalised, rotated and written to k_cache[b, h, pos]; v heads are copied to v_cache[b, h, pos].
`pos` is read inside the kernel from a device tensor, so a captured graph stays valid as pos advances;
it holds one position, or one per row (rows with different prompts), with cos/sin to match.

Numerics as `reference` below (engine/model/layers.RMSNorm and apply_rope): RMSNorm in fp32 rounded to
the dtype then scaled in the dtype; RoPE as addcmul(qk * cos, cat(x2, x1), sin_signed) with qk * cos
rounded to the dtype and the addcmul computed in fp32 and rounded once.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ._util import require
from .pdl import launch_options

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _pdl_enter = _round = _heads_norm_rope = _token_kv = _live_row = _put_kv = _rope_q_kv = None


def _norm_rope(qkv, qk_norm_weight, cos, sin_signed, eps, d, nh, nkv):
    """Rows of qkv [B, ...] -> (q and k normed and rotated [B, nh + nkv, D], v [B, nkv, D])."""
    b = qkv.shape[0]
    qkv = qkv.reshape(b, -1)
    qk = qkv[:, : (nh + nkv) * d].view(b, nh + nkv, d)
    qk = F.rms_norm(qk, (d,), eps=eps) * qk_norm_weight
    half = d // 2
    cos, sin_signed = cos.reshape(-1, 1, d), sin_signed.reshape(-1, 1, d)  # shared, or one row per qkv row
    qk = torch.addcmul(qk * cos, torch.cat((qk[..., half:], qk[..., :half]), -1), sin_signed)
    return qk, qkv[:, (nh + nkv) * d: (nh + 2 * nkv) * d].view(b, nkv, d)


def reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv):
    """The torch ops this kernel replaces in FusedLayer.step (returns q [B, nh, D]; writes the caches at pos)."""
    b = qkv.shape[0]
    qk, v = _norm_rope(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache.shape[-1], nh, nkv)
    pos = pos.reshape(-1)
    if pos.numel() == 1:
        k_cache.index_copy_(2, pos, qk[:, nh:, None])
        v_cache.index_copy_(2, pos, v[:, :, None])
    else:  # rows at different positions
        rows = torch.arange(b, device=pos.device)
        k_cache[rows, :, pos] = qk[:, nh:]
        v_cache[rows, :, pos] = v
    return qk[:, :nh]


def prefill_reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, nh, nkv):
    """The torch ops `prefill` replaces in FusedLayer.prefill: qkv [T, ...] of positions 0..T-1, cos and
    sin_signed [T, D]; writes positions 0..T-1 of the batch-1 caches and returns q [T, nh, D]."""
    t = qkv.shape[0]
    qk, v = _norm_rope(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache.shape[-1], nh, nkv)
    k_cache[0, :, :t] = qk[:, nh:].transpose(0, 1)
    v_cache[0, :, :t] = v.transpose(0, 1)
    return qk[:, :nh]


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter, _round, _heads_norm_rope, _token_kv, _live_row, _put_kv, _rope_q_kv
    import triton
    import triton.language as tl

    from . import linear as kl
    from .pdl import enter
    _pdl_enter = enter()
    kl._kernel()
    _round = kl._round

    @triton.jit
    def _heads_norm_rope(row_ptr, w_ptr, heads, ok, cols, rot, c, s, eps, D: tl.constexpr, dt: tl.constexpr,
                         EMULATE_RNE: tl.constexpr):
        """RMSNorm over each head [R, D] then RoPE, rounding as `_norm_rope` (the torch path) does.
        Shared by the fused attention (_rope_q_kv)."""
        src = row_ptr + heads[:, None] * D
        x = tl.load(src + cols[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        xr = tl.load(src + rot[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        rinv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + heads[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + heads[:, None] * D + rot[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        y = _round(_round(x * rinv[:, None], dt, EMULATE_RNE).to(tl.float32) * w, dt, EMULATE_RNE).to(tl.float32)
        yr = _round(_round(xr * rinv[:, None], dt, EMULATE_RNE).to(tl.float32) * wr, dt, EMULATE_RNE)
        return _round(_round(y * c[None, :], dt, EMULATE_RNE).to(tl.float32) + yr.to(tl.float32) * s[None, :],
                      dt, EMULATE_RNE)

    @triton.jit
    def _token_kv(row, qkn_ptr, h, cols, rot, c, s, eps, NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr,
                  dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """kv head h of a decode token's qkv row: (k normed and rotated, v, live) as two [2, D] tiles whose
        first row is the head (the smallest 2-D tile) and the mask of that row (`_put_kv` stores them).
        Shared by every kernel that writes a decode token's k / v."""
        ki = tl.arange(0, 2)
        live = ki < 1
        k = _heads_norm_rope(row, qkn_ptr, NH + h + ki, live, cols, rot, c, s, eps, D, dt, EMULATE_RNE)
        v = tl.load(row + (NH + NKV + h + ki)[:, None] * D + cols[None, :], mask=live[:, None], other=0.0,
                    cache_modifier=".cg")
        return k, v, live

    @triton.jit
    def _live_row(x, live):
        """The one live row of a `_token_kv` tile, [D] in fp32 (for a kernel that uses it from registers)."""
        return tl.sum(tl.where(live[:, None], x.to(tl.float32), 0.0), axis=0)

    @triton.jit
    def _put_kv(k_at, v_at, k, v, live, cols):
        """Stores `_token_kv`'s tiles: k_at / v_at point at the token's row of each cache."""
        at = tl.arange(0, 2)[:, None] * 0 + cols[None, :]
        tl.store(k_at + at, k, mask=live[:, None])
        tl.store(v_at + at, v, mask=live[:, None])

    @triton.jit
    def _rope_q_kv(qkv_ptr, qkn_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, b, h, pos, write_kv, stride_qkv, stride_cos,
                   skb, skh, sks, svb, svh, svs, eps, G, R: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr,
                   D: tl.constexpr, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """For row b and kv head h of a decode token: the G query heads of h, normed and rotated, as [R, D]
        in dt (rows past G are zero); if write_kv, also its k (normed, rotated) and v into the caches at
        pos. Attention kernels call this instead of reading a q written by qk_norm_rope_kv_kernel: the same
        values, one launch fewer. The cache writes are made visible to the whole program (a barrier), so its
        window loads read them back."""
        cols = tl.arange(0, D)
        rot = (cols + D // 2) % D
        c = tl.load(cos_ptr + b * stride_cos + cols).to(tl.float32)
        s = tl.load(sin_ptr + b * stride_cos + cols).to(tl.float32)
        row = qkv_ptr + b * stride_qkv
        gi = tl.arange(0, R)
        q = _heads_norm_rope(row, qkn_ptr, h * G + gi, gi < G, cols, rot, c, s, eps, D, dt, EMULATE_RNE)
        if write_kv:
            k, v, live = _token_kv(row, qkn_ptr, h, cols, rot, c, s, eps, NH, NKV, D, dt, EMULATE_RNE)
            _put_kv(k_ptr + b * skb + h * skh + pos * sks, v_ptr + b * svb + h * svh + pos * svs, k, v, live, cols)
            tl.debug_barrier()  # the program's own cache writes are seen by all its threads
        return q

    @triton.jit
    def qk_norm_rope_kv_kernel(qkv_ptr, w_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, pos_ptr,
                               stride_qkv, stride_q, skb, skh, sks, svb, svh, svs, stride_pos, stride_cos, eps,
                               NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, SEQ: tl.constexpr,
                               PDL: tl.constexpr):
        _pdl_enter(PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        cols = tl.arange(0, D)
        src = qkv_ptr + b * stride_qkv + h * D
        if SEQ:  # prefill: program row b is the token at position b (the cache batch stride is 0)
            pos = b
        else:
            pos = tl.load(pos_ptr + b * stride_pos)
        if h < NH + NKV:
            rot = (cols + D // 2) % D
            x = tl.load(src + cols).to(tl.float32)
            xr = tl.load(src + rot).to(tl.float32)
            rinv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
            w = tl.load(w_ptr + h * D + cols).to(tl.float32)
            wr = tl.load(w_ptr + h * D + rot).to(tl.float32)
            dt = q_ptr.dtype.element_ty
            y = ((x * rinv).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
            yr = ((xr * rinv).to(dt).to(tl.float32) * wr).to(dt).to(tl.float32)
            c = tl.load(cos_ptr + b * stride_cos + cols).to(tl.float32)
            s = tl.load(sin_ptr + b * stride_cos + cols).to(tl.float32)
            out = ((y * c).to(dt).to(tl.float32) + yr * s).to(dt)
            if h < NH:
                tl.store(q_ptr + b * stride_q + h * D + cols, out)
            else:
                tl.store(k_ptr + b * skb + (h - NH) * skh + pos * sks + cols, out)
        else:
            v = tl.load(src + cols)
            tl.store(v_ptr + b * svb + (h - NH - NKV) * svh + pos * svs + cols, v)

    return qk_norm_rope_kv_kernel


def _inputs(qkv, qk_norm_weight, cos, sin_signed, k_cache, v_cache, nh, nkv):
    """The launchers' shared checks: qkv as contiguous rows, and the RoPE tables as [rows, D] -> (qkv2, cos,
    sin_signed, D)."""
    d = k_cache.shape[-1]
    qkv2 = qkv.reshape(qkv.shape[0], -1)
    require(qkv2.stride(-1) == 1 and qkv2.shape[1] >= (nh + 2 * nkv) * d, "contiguous qkv rows of all heads")
    require(k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and qk_norm_weight.is_contiguous(),
            "contiguous caches and norm weight")
    return qkv2, cos.reshape(-1, d).contiguous(), sin_signed.reshape(-1, d).contiguous(), d


def _rows_at_own_positions(b, pos, cos, sin_signed) -> bool:
    """Whether a decode launch's rows each sit at their own position (pos [B], one RoPE row each) rather than
    all at one; checks that the RoPE tables (as `_inputs` returns them) match."""
    per_row = b > 1 and pos.numel() == b
    require(cos.shape[0] == (b if per_row else 1) == sin_signed.shape[0], "one RoPE row per batch row, or one for all")
    return per_row


def qk_norm_rope_kv(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv, pdl=False):
    """qkv [B, (nh + 2 nkv) * D] or [B, 1, ...]; qk_norm_weight [nh + nkv, D] contiguous; cos, sin_signed
    [D] (any leading 1-dims) or [B, D] (one position per row); k_cache, v_cache [B, nkv, S, D] with
    contiguous last dim; pos a 1-element long device tensor, or [B] (one per row) -> q [B, nh, D]
    (contiguous) in qkv.dtype."""
    b = qkv.shape[0]
    qkv2, cos, sin_signed, d = _inputs(qkv, qk_norm_weight, cos, sin_signed, k_cache, v_cache, nh, nkv)
    per_row = _rows_at_own_positions(b, pos, cos, sin_signed)
    q = torch.empty(b, nh, d, dtype=qkv.dtype, device=qkv.device)
    _kernel()[(b, nh + 2 * nkv)](
        qkv2, qk_norm_weight, cos, sin_signed, q, k_cache, v_cache, pos,
        qkv2.stride(0), q.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
        1 if per_row else 0, d if per_row else 0, float(eps),
        NH=nh, NKV=nkv, D=d, SEQ=False, num_warps=1 if d <= 128 else 2, **launch_options(pdl))
    return q


def prefill(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, nh, nkv, pdl=False):
    """Same contract as `prefill_reference`: qkv [T, (nh + 2 nkv) * D] (rows contiguous), cos and
    sin_signed [T, D]; k_cache, v_cache [1, nkv, S >= T, D] -> q [T, nh, D] (contiguous)."""
    t = qkv.shape[0]
    require(k_cache.shape[0] == 1 == v_cache.shape[0] and t <= k_cache.shape[2], "a batch-1 cache holding T positions")
    qkv2, cos, sin_signed, d = _inputs(qkv, qk_norm_weight, cos, sin_signed, k_cache, v_cache, nh, nkv)
    require(cos.shape[0] == t == sin_signed.shape[0], "one RoPE row per token")
    q = torch.empty(t, nh, d, dtype=qkv.dtype, device=qkv.device)
    _, skh, sks = k_cache.stride()[:3]
    _, svh, svs = v_cache.stride()[:3]
    _kernel()[(t, nh + 2 * nkv)](
        qkv2, qk_norm_weight, cos, sin_signed, q, k_cache, v_cache, q,  # pos_ptr unused (SEQ)
        qkv2.stride(0), q.stride(0), 0, skh, sks, 0, svh, svs, 0, d, float(eps),
        NH=nh, NKV=nkv, D=d, SEQ=True, num_warps=1 if d <= 128 else 2, **launch_options(pdl))
    return q
