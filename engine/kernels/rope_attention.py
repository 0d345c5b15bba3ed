"""q/k RMSNorm + RoPE + KV-cache write and decode attention over a short window, in one launch: the
code predictor's two small kernels per layer (qk_norm_rope_kv, attention) become one, 75 fewer launches
a frame.

One program per (row, kv head), as the attention kernel: it normalises, rotates and writes its k head
and copies its v head into the cache at the row's position, normalises and rotates its G query heads
in registers, then (after a block barrier, so its own cache writes are visible to all its threads)
attends over the window with an online softmax. Numerics are exactly those of the two kernels in a row:
q is rounded to the dtype as if stored, scores and the scaled bias add are rounded to the dtype,
softmax in fp32 (see qk_norm_rope_kv.py and attention.py).

Only for short windows (one program streams the whole window): Kernels.rope_attention picks it up to
MAX_WINDOW positions and runs the two kernels otherwise.
"""
from __future__ import annotations

import functools

import torch

from ._util import next_pow2, require
from .pdl import launch_options

triton = tl = _pdl_enter = _norm_rope_rows = None  # bound on first use by _kernel()

MAX_WINDOW = 64


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter, _norm_rope_rows
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()

    @triton.jit
    def _norm_rope_rows(src, heads, hmask, w_ptr, cos, sin, eps, dt: tl.constexpr, D: tl.constexpr):
        """Rows `heads` of the merged qkv row at `src`: RMSNorm (fp32, rounded, weighted, rounded) and
        RoPE (x * cos rounded, + rotate_half(x) * sin_signed in fp32, rounded) -> [len(heads), D] in dt."""
        cols = tl.arange(0, D)
        rot = (cols + D // 2) % D
        x = tl.load(src + heads[:, None] * D + cols[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
        xr = tl.load(src + heads[:, None] * D + rot[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
        rinv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + heads[:, None] * D + cols[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + heads[:, None] * D + rot[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
        y = ((x * rinv[:, None]).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
        yr = ((xr * rinv[:, None]).to(dt).to(tl.float32) * wr).to(dt).to(tl.float32)
        return ((y * cos[None, :]).to(dt).to(tl.float32) + yr * sin[None, :]).to(dt)

    @triton.jit
    def rope_attention_kernel(qkv_ptr, w_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, pos_ptr, bias_ptr, out_ptr,
                              stride_qkv, skb, skh, sks, svb, svh, svs, stride_pos, stride_cos, stride_bias,
                              stride_ob, W, eps, scale, NH: tl.constexpr, NKV: tl.constexpr, G: tl.constexpr,
                              GP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
        _pdl_enter(PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        dt = out_ptr.dtype.element_ty
        di = tl.arange(0, D)
        src = qkv_ptr + b * stride_qkv
        pos = tl.load(pos_ptr + b * stride_pos)
        cos = tl.load(cos_ptr + b * stride_cos + di).to(tl.float32)
        sin = tl.load(sin_ptr + b * stride_cos + di).to(tl.float32)
        # this kv head: k normed, rotated and cached; v copied
        kh = NH + h + tl.arange(0, 1)
        k_new = _norm_rope_rows(src, kh, kh < NH + NKV, w_ptr, cos, sin, eps, dt, D)
        k_base = k_ptr + b * skb + h * skh
        v_base = v_ptr + b * svb + h * svh
        tl.store(k_base + pos * sks + di[None, :], k_new)
        tl.store(v_base + pos * svs + di, tl.load(src + (NH + NKV + h) * D + di))
        # its G query heads, kept in registers
        gi = tl.arange(0, GP)
        gmask = gi < G
        q = _norm_rope_rows(src, h * G + gi, gmask, w_ptr, cos, sin, eps, dt, D).to(tl.float32)
        tl.debug_barrier()  # this program's cache writes are visible to all its threads
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for start in range(0, W, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            nmask = n < W
            k = tl.load(k_base + n[:, None] * sks + di[None, :], mask=nmask[:, None], other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2).to(dt).to(tl.float32)  # [GP, BLOCK_N]
            bias = tl.load(bias_ptr + b * stride_bias + n, mask=nmask, other=float("-inf")).to(tl.float32)
            s = (bias[None, :] + scale * s).to(dt).to(tl.float32)
            s = tl.where(nmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + n[:, None] * svs + di[None, :], mask=nmask[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + b * stride_ob + (h * G + gi[:, None]) * D + di[None, :], out.to(dt), mask=gmask[:, None])

    return rope_attention_kernel


def reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv, bias, scale):
    """The two references in a row: returns [B, nkv, g, D] and writes the caches at pos."""
    from . import attention, qk_norm_rope_kv

    q = qk_norm_rope_kv.reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv)
    return attention.reference(q, k_cache, v_cache, bias, scale)


def rope_attention(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv, bias, scale,
                   pdl=False, block_n: int = 16):
    """Same contract as `reference` (qk_norm_rope_kv's inputs, then attention's bias [W] or [B, 1, 1, W]
    and scale), window W <= MAX_WINDOW."""
    b = qkv.shape[0]
    d = k_cache.shape[-1]
    g = nh // nkv
    window = bias.shape[-1]
    qkv2 = qkv.reshape(b, -1)
    require(window <= MAX_WINDOW, f"a window of at most {MAX_WINDOW} positions")
    require(qkv2.stride(-1) == 1 and qkv2.shape[1] >= (nh + 2 * nkv) * d, "contiguous qkv rows of all heads")
    require(k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and qk_norm_weight.is_contiguous()
            and bias.is_contiguous(), "contiguous caches, norm weight and bias")
    cos = cos.reshape(-1, d).contiguous()
    sin_signed = sin_signed.reshape(-1, d).contiguous()
    per_row = b > 1 and pos.numel() == b
    require(cos.shape[0] == (b if per_row else 1) == sin_signed.shape[0], "one RoPE row per batch row, or one for all")
    bias_per_row = bias.dim() > 1 and bias.shape[0] == b > 1
    out = torch.empty(b, nkv, g, d, dtype=qkv.dtype, device=qkv.device)
    _kernel()[(b, nkv)](
        qkv2, qk_norm_weight, cos, sin_signed, k_cache, v_cache, pos, bias, out,
        qkv2.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], 1 if per_row else 0, d if per_row else 0,
        window if bias_per_row else 0, out.stride(0), window, float(eps), float(scale),
        NH=nh, NKV=nkv, G=g, GP=max(next_pow2(g), 1), D=d, BLOCK_N=block_n, num_warps=4, **launch_options(pdl))
    return out
