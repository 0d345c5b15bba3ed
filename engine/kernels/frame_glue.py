"""The frame graph's small steps between its big ones, as two launches instead of ~18 torch kernels.

    talker_input: x = sum of the frame's 16 codebook embeddings, + the row's trailing text embedding;
                  and the talker's RoPE angles (cos, sin) at each row's position
    frame_tail:   hidden = final RMSNorm of the talker's output; the row bookkeeping (valid, t, finished, pos)

Why: at one take these are 18 tiny launches between the code predictor, the talker and the next frame (stack,
cat, copy, sum, minimum, add, index_select x3; the final norm, copy, add, >=, or, not, add). torch launches
also break the programmatic-dependent-launch chain: the kernel after one cannot start early.

Programs: talker_input one a row and 256 columns, frame_tail one a row (its norm needs the whole row).
Numerics as the torch ops they replace: the embedding sum accumulates in fp32 and rounds once to the dtype (as
torch's sum; only the order of the fp32 additions may differ), the trailing row is added in fp32 and rounded
again; RMSNorm as rms_norm.py (normalise in fp32, round, times the weight, round).
"""
from __future__ import annotations

import functools

import torch

from . import emulate_rne
from ._util import next_pow2, require, warps_for
from .pdl import launch_options
from .rms_norm import reference as rms_norm_reference

triton = tl = _pdl_enter = _round = None  # bound on first use by _kernel()

# talker_input's columns a program: a row's 16 loads spread over H / INPUT_BLOCK SMs instead of one
INPUT_BLOCK = 256


def talker_input_reference(rows, trailing, trailing_start, t, trailing_last, rope_table, pos):
    """rows [B, G, H]: the frame's codebook embeddings; trailing [R, H] with each row's text from
    trailing_start [B], read at min(t, trailing_last); rope_table (cos, sin) [P, D] -> (x [B, H], cos, sin [B, D])."""
    x = rows.sum(dim=1)
    x = x + trailing.index_select(0, trailing_start + torch.minimum(t, trailing_last))
    return x, rope_table[0].index_select(0, pos), rope_table[1].index_select(0, pos)


def frame_tail_reference(out, norm_weight, eps, hidden, finished, valid, t, limit, pos):
    """out [B, H]: the talker's last layer. hidden <- RMSNorm(out); then valid = not finished (this frame is
    real), t += valid, finished |= t >= limit (the budget is spent), pos += not finished (a finished row
    rewrites its last position and never passes its room). Everything is updated in place."""
    hidden.copy_(rms_norm_reference(out, norm_weight, eps))
    torch.logical_not(finished, out=valid)
    t.add_(valid)
    finished.logical_or_(t >= limit)
    pos.add_(~finished)


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter, _round
    import triton
    import triton.language as tl

    from . import linear as kl
    from .pdl import enter
    _pdl_enter = enter()
    kl._kernel()
    _round = kl._round

    @triton.jit
    def talker_input_kernel(rows_ptr, s_rb, s_rg, trail_ptr, s_tr, tstart_ptr, t_ptr, tlast_ptr, cos_ptr, sin_ptr,
                            s_rope, pos_ptr, x_ptr, cos_out_ptr, sin_out_ptr, H, D, G: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, EMULATE_RNE: tl.constexpr,
                            PDL: tl.constexpr):
        _pdl_enter(PDL)
        b = tl.program_id(0)
        dt = x_ptr.dtype.element_ty
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = h < H
        acc = tl.zeros([BLOCK_H], tl.float32)
        for g in tl.static_range(G):  # codebook order, as the rows were stacked
            acc += tl.load(rows_ptr + b * s_rb + g * s_rg + h, mask=h_ok, other=0.0).to(tl.float32)
        x = _round(acc, dt, EMULATE_RNE).to(tl.float32)
        at = tl.load(tstart_ptr + b) + tl.minimum(tl.load(t_ptr + b), tl.load(tlast_ptr + b))
        x = x + tl.load(trail_ptr + at * s_tr + h, mask=h_ok, other=0.0).to(tl.float32)
        tl.store(x_ptr + b * H + h, _round(x, dt, EMULATE_RNE), mask=h_ok)
        if tl.program_id(1) == 0:  # the row's RoPE angles
            d = tl.arange(0, BLOCK_D)
            d_ok = d < D
            p = tl.load(pos_ptr + b)
            tl.store(cos_out_ptr + b * D + d, tl.load(cos_ptr + p * s_rope + d, mask=d_ok), mask=d_ok)
            tl.store(sin_out_ptr + b * D + d, tl.load(sin_ptr + p * s_rope + d, mask=d_ok), mask=d_ok)

    @triton.jit
    def frame_tail_kernel(out_ptr, s_out, w_ptr, eps, hidden_ptr, s_hidden, fin_ptr, valid_ptr, t_ptr, limit_ptr,
                          pos_ptr, H, BLOCK_H: tl.constexpr, EMULATE_RNE: tl.constexpr, PDL: tl.constexpr):
        b = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)
        h_ok = h < H
        w = tl.load(w_ptr + h, mask=h_ok, other=0.0).to(tl.float32)  # a weight: read before the wait
        _pdl_enter(PDL)
        dt = hidden_ptr.dtype.element_ty
        x = tl.load(out_ptr + b * s_out + h, mask=h_ok, other=0.0).to(tl.float32)
        rinv = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
        y = _round(x * rinv, dt, EMULATE_RNE).to(tl.float32)
        tl.store(hidden_ptr + b * s_hidden + h, _round(y * w, dt, EMULATE_RNE), mask=h_ok)
        live = tl.load(fin_ptr + b) == 0
        tl.store(valid_ptr + b, live.to(tl.uint8))
        t = tl.load(t_ptr + b) + live.to(tl.int64)
        tl.store(t_ptr + b, t)
        done = (~live) | (t >= tl.load(limit_ptr + b))
        tl.store(fin_ptr + b, done.to(tl.uint8))
        tl.store(pos_ptr + b, tl.load(pos_ptr + b) + (~done).to(tl.int64))

    return talker_input_kernel, frame_tail_kernel


def talker_input(rows, trailing, trailing_start, t, trailing_last, rope_table, pos, pdl=False):
    """Same arguments and results as `talker_input_reference`, in one launch."""
    b, g, hid = rows.shape
    cos, sin = rope_table
    d = cos.shape[-1]
    require(rows.stride(-1) == 1 and trailing.stride(-1) == 1 and trailing.shape[-1] == hid,
            "rows [B, G, H] and trailing [R, H], rows contiguous")
    require(cos.stride() == sin.stride() and cos.stride(-1) == 1 and sin.shape == cos.shape, "rope tables [P, D]")
    require(all(v.numel() == b and v.dtype == torch.long and v.is_contiguous() for v in (trailing_start, t,
                                                                                           trailing_last, pos)),
            "one long per row: trailing_start, t, trailing_last, pos")
    x = torch.empty(b, hid, dtype=rows.dtype, device=rows.device)
    cos_out = torch.empty(b, d, dtype=cos.dtype, device=cos.device)
    sin_out = torch.empty(b, d, dtype=sin.dtype, device=sin.device)
    block = min(INPUT_BLOCK, next_pow2(hid))
    _kernel()[0][(b, -(-hid // block))](
        rows, rows.stride(0), rows.stride(1), trailing, trailing.stride(0), trailing_start, t, trailing_last, cos, sin,
        cos.stride(0), pos, x, cos_out, sin_out, hid, d, G=g, BLOCK_H=block, BLOCK_D=next_pow2(d),
        EMULATE_RNE=emulate_rne(rows.dtype), num_warps=warps_for(block), **launch_options(pdl))
    return x, cos_out, sin_out


def frame_tail(out, norm_weight, eps, hidden, finished, valid, t, limit, pos, pdl=False):
    """Same arguments and effects as `frame_tail_reference`, in one launch."""
    b, hid = out.shape
    require(out.stride(-1) == 1 and hidden.stride(-1) == 1 and hidden.shape == out.shape, "out / hidden [B, H]")
    require(finished.dtype == valid.dtype == torch.bool and t.dtype == limit.dtype == pos.dtype == torch.long,
            "finished / valid bool, t / limit / pos long")
    require(all(v.numel() == b and v.is_contiguous() for v in (finished, valid, t, limit, pos)), "one value per row")
    block = next_pow2(hid)
    flags = (finished.view(torch.uint8), valid.view(torch.uint8))
    _kernel()[1][(b,)](out, out.stride(0), norm_weight, float(eps), hidden, hidden.stride(0), *flags, t, limit, pos,
                       hid, BLOCK_H=block, EMULATE_RNE=emulate_rne(hidden.dtype), num_warps=warps_for(block),
                       **launch_options(pdl))
