"""SwiGLU of merged gate/up rows, silu(gate) * up, in one launch: [M, 2I] -> [M, I].

The MLP's activation where the down linear cannot take it as its prologue: a matmul on cuBLAS (many rows),
or the tensor-core path's long SwiGLU (linear_plan.SWIGLU_IN_DOT_MAX_K). torch runs it as two launches
(silu, then the product) and writes the silu between them.

Numerics as the linear's SwiGLU prologue: SiLU in fp32, rounded to x.dtype, then the product with up in fp32,
rounded once.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import emulate_rne
from ._util import require
from .pdl import launch_options

triton = tl = _round = _pdl_enter = None  # bound on first use by _kernel()

BLOCK = 1024


def reference(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]


@functools.cache
def _kernel():
    global triton, tl, _round, _pdl_enter
    import triton
    import triton.language as tl

    from . import linear
    from .pdl import enter
    _pdl_enter = enter()
    linear._kernel()
    _round = linear._round  # the linear's rounding, so its SwiGLU prologue and this launch round alike

    @triton.jit
    def silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr, EMULATE_RNE: tl.constexpr,
                        PDL: tl.constexpr):
        _pdl_enter(PDL)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        dt = out_ptr.dtype.element_ty
        g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
        s = _round(g / (1.0 + tl.exp(-g)), dt, EMULATE_RNE).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, _round(s * u, dt, EMULATE_RNE), mask=mask)

    return silu_mul_kernel


def silu_mul(x: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [..., 2I] (leading dims collapsible to rows) -> [..., I], x.dtype."""
    two = x.shape[-1]
    require(two % 2 == 0, f"gate/up rows of even width (got {two})")
    x2 = x.reshape(-1, two)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    inter = two // 2
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    if out.numel():
        _kernel()[(x2.shape[0], -(-inter // BLOCK))](
            x2, out, x2.stride(0), out.stride(0), inter, BLOCK=BLOCK, EMULATE_RNE=emulate_rne(x.dtype), num_warps=4,
            **launch_options(pdl))
    return out.view(*x.shape[:-1], inter)
