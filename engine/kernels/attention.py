"""Decode attention for one query token over a fixed window of the static cache, in one launch
(replaces scores matmul + scaled bias add + softmax + probs @ V).

q [B, nh, D]; k_cache, v_cache [B, nkv, S, D]; bias [W] additive (0 / -inf) over the first W positions,
shared by every row, or [B, 1, 1, W] (rows at different positions).
One program per (row, kv head) handles that head's nh / nkv query heads and streams the window in
blocks with an online softmax in fp32. Scores are rounded to the activation dtype and the scaled bias
add rounded again, as in the torch path; the probabilities are not rounded before the V product (the
torch path rounds them to the dtype), so bf16 results differ from the reference by a few ulps.

Meant for short windows: the code predictor's 16 positions always; for the talker's long windows, keep
it only where kernel_bench shows it beating the three torch kernels (one program per kv head).
"""
from __future__ import annotations

import functools

import torch

from ._util import next_pow2, require
from .pdl import launch_options

triton = tl = _pdl_enter = None  # bound on first use by _kernel()


def reference(q, k_cache, v_cache, bias, scale):
    """The torch ops this kernel replaces in FusedLayer.step: q [B, nh, D] -> out [B, nkv, g, D]
    (reshape to [B, nh * D])."""
    b, nh, d = q.shape
    nkv = k_cache.shape[1]
    window = bias.shape[-1]
    scores = torch.matmul(q.reshape(b, nkv, nh // nkv, d), k_cache[:, :, :window].transpose(-1, -2))
    probs = torch.softmax(torch.add(bias, scores, alpha=scale), dim=-1)
    return torch.matmul(probs, v_cache[:, :, :window])


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()

    @triton.jit
    def attention_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, out_ptr, stride_qb, skb, skh, sks, svb, svh, svs,
                         stride_ob, stride_bias, W, scale, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                         BLOCK_N: tl.constexpr, PDL: tl.constexpr):
        _pdl_enter(PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        dt = q_ptr.dtype.element_ty
        gi = tl.arange(0, GP)
        di = tl.arange(0, D)
        gmask = gi < G
        q = tl.load(q_ptr + b * stride_qb + (h * G + gi[:, None]) * D + di[None, :], mask=gmask[:, None],
                    other=0.0).to(tl.float32)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        k_base = k_ptr + b * skb + h * skh
        v_base = v_ptr + b * svb + h * svh
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
        tl.store(out_ptr + b * stride_ob + (h * G + gi[:, None]) * D + di[None, :], out.to(dt),
                 mask=gmask[:, None])

    return attention_kernel


def attention(q, k_cache, v_cache, bias, scale, block_n: int = 16, pdl: bool = False):
    """Same contract as reference: returns [B, nkv, g, D] (contiguous, so .view(B, nh * D) is free)."""
    b, nh, d = q.shape
    nkv = k_cache.shape[1]
    g = nh // nkv
    window = bias.shape[-1]
    q = q if q.stride(-1) == 1 and q.stride(1) == d else q.contiguous()
    require(k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and bias.is_contiguous(), "contiguous caches and bias")
    per_row = bias.dim() > 1 and bias.shape[0] == b > 1
    out = torch.empty(b, nkv, g, d, dtype=q.dtype, device=q.device)
    _kernel()[(b, nkv)](q, k_cache, v_cache, bias, out, q.stride(0), *k_cache.stride()[:3],
                        *v_cache.stride()[:3], out.stride(0), window if per_row else 0, window, float(scale),
                        G=g, GP=max(next_pow2(g), 1), D=d, BLOCK_N=block_n, num_warps=4, **launch_options(pdl))
    return out
