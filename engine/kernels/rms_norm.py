"""RMSNorm over the last dim of [M, N] rows in one launch.

Numerics as engine/model/layers.RMSNorm: normalise in fp32, round to x.dtype, then multiply by the
weight in x.dtype (a bf16/fp16 product of two rounded values, rounded once).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ._util import next_pow2, warps_for
from .pdl import launch_options

triton = tl = _pdl_enter = None  # bound on first use by _kernel()


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * weight


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
        _pdl_enter(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        rinv = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        y = (x * rinv).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)

    return rms_norm_kernel


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """x [..., N] (last dim contiguous; leading dims collapsible to rows) -> same shape, x.dtype."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    block = next_pow2(n)
    _kernel()[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0), n, float(eps),
                              BLOCK=block, num_warps=warps_for(block), **launch_options(pdl))
    return out.view(x.shape)
