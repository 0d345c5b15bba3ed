"""SwiGLU activation of the merged gate/up output: silu(gu[:, :I]) * gu[:, I:] in one launch.

Numerics as fused_layers: silu in fp32 rounded to the activation dtype, then a product in that dtype.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

triton = tl = None  # bound on first use by _kernel()

BLOCK = 1024


def reference(gu: torch.Tensor) -> torch.Tensor:
    inter = gu.shape[-1] // 2
    return F.silu(gu[..., :inter]) * gu[..., inter:]


@functools.cache
def _kernel():
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_o, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * stride_gu + inter + cols, mask=mask, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (s * u).to(out_ptr.dtype.element_ty), mask=mask)

    return silu_mul_kernel


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [..., 2I] (last dim contiguous) -> [..., I] in gu.dtype."""
    two_i = gu.shape[-1]
    inter = two_i // 2
    g2 = gu.reshape(-1, two_i)
    if g2.stride(-1) != 1:
        g2 = g2.contiguous()
    out = torch.empty(g2.shape[0], inter, dtype=gu.dtype, device=gu.device)
    block = min(BLOCK, 1 << (inter - 1).bit_length())
    grid = (g2.shape[0], -(-inter // block))
    _kernel()[grid](g2, out, g2.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4)
    return out.view(*gu.shape[:-1], inter)
