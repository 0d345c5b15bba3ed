"""The second half of the codec's residual unit in one launch:

    out = (x [+ x_bias]) + conv1x1(SnakeBeta(h + h_bias)) = x + snake(h + h_bias) @ W^T + bias

h is the unit's dilated conv output (its bias left to here), x the unit's input. torch runs this as the
SnakeBeta launch, a matmul and the residual add: the activation is written and read back, the matmul's
output written and read back, and x read, three passes more over the largest tensors of the codec's
waveform path. Here each program
activates a [BLOCK_M rows, BLOCK_K channels] tile of h in registers, multiplies it on tensor cores, and
adds the bias and the residual to its output tile.

x_bias is the wave block's transposed-conv bias, which the decoder leaves out of that conv (one pass over its
output fewer) and adds where the output is read: here and in the first SnakeBeta.

Numerics follow the torch path: the SnakeBeta is engine/kernels/snake.py's (its rounding points and sine);
the matmul accumulates in fp32 with the bias added to the fp32 sum and rounded once (F.linear's epilogue);
x + x_bias and the residual add each round to x.dtype, as torch's adds. Only the matmul's summation order
differs from cuBLAS.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import emulate_rne, interpreting, snake
from ._util import next_pow2, require, rows_contiguous
from .pdl import launch_options

triton = tl = _round = _to_fp32 = _plus_bias = _activate = _pdl_enter = None  # bound on first use by _kernel()


def reference(h, freq, inv_mag, h_bias, weight, bias, x, x_bias=None):
    """h, x [B, L, C] time-major; freq, inv_mag, h_bias, bias, x_bias [C]; weight [C_out, C]: the torch ops."""
    y = F.linear(snake.reference(h, freq, inv_mag, h_bias), weight, bias)
    if x_bias is not None:
        x = x + x_bias
    return x + y


def _fits(h: torch.Tensor, n_out: int) -> bool:
    """The kernel's int32 offsets hold for h [B, L, C] and an output n_out wide."""
    return max(h.numel(), h.shape[0] * h.shape[1] * n_out) < 2 ** 31


def runs(h: torch.Tensor, n_out: int) -> bool:
    """Whether the decoder runs this launch for h [B, L, C] (n_out output channels): `plan` picks it at this
    width and the kernel's int32 offsets hold."""
    return plan(h.shape[0] * h.shape[1], h.shape[2]) is not None and _fits(h, n_out)


@functools.cache
def _kernel():
    global triton, tl, _round, _to_fp32, _plus_bias, _activate, _pdl_enter
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()
    snake._kernel()
    _round, _to_fp32, _plus_bias, _activate = snake._round, snake._to_fp32, snake._plus_bias, snake._activate

    @triton.jit(do_not_specialize=["rows", "L", "stride_hb", "stride_xb"])  # one compile per width, any length
    def snake_conv1x1_kernel(h_ptr, stride_hb, freq_ptr, inv_ptr, hb_ptr, w_ptr, bias_ptr, x_ptr, stride_xb,
                             xb_ptr, out_ptr, rows, L, C: tl.constexpr, N: tl.constexpr,
                             HAS_HB: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_XB: tl.constexpr,
                             FAST_SIN: tl.constexpr, IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        """Output tile [BLOCK_M rows (b * L + t), BLOCK_N channels]; programs of one row block are adjacent, so
        the column blocks of a row block read its h tile while it is in L2."""
        n_blocks: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
        pid = tl.program_id(0)
        pid_m = pid // n_blocks
        pid_n = pid - pid_m * n_blocks
        r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        r_ok, n_ok = r < rows, rn < N
        b = r // L
        t = r - b * L
        dt: tl.constexpr = out_ptr.dtype.element_ty
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        _pdl_enter(PDL)
        for k0 in range(0, C, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < C
            mask = r_ok[:, None] & k_ok[None, :]
            hf = tl.load(h_ptr + (b * stride_hb + t * C)[:, None] + rk[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_HB:  # the dilated conv's bias, rounded where its own add would round it
                hf = _plus_bias(hf, hb_ptr, rk, k_ok, dt, EMULATE_RNE)
            f = tl.load(freq_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            m = tl.load(inv_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            a = tl.where(mask, _activate(hf, f, m, dt, FAST_SIN, EMULATE_RNE), 0.0).to(dt)
            w = tl.load(w_ptr + rn[None, :] * C + rk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            if IEEE:  # fp32 inputs, or the interpreter (its numpy dot has no bf16): exact fp32 products
                acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(a, w)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y = _to_fp32(acc, dt, EMULATE_RNE)  # F.linear's output
        out_mask = r_ok[:, None] & n_ok[None, :]
        xf = tl.load(x_ptr + (b * stride_xb + t * N)[:, None] + rn[None, :], mask=out_mask, other=0.0).to(tl.float32)
        if HAS_XB:
            xf = _plus_bias(xf, xb_ptr, rn, n_ok, dt, EMULATE_RNE)
        tl.store(out_ptr + r[:, None] * N + rn[None, :], _round(xf + y, dt, EMULATE_RNE), mask=out_mask)

    return snake_conv1x1_kernel


# Tiles: rows x output channels x input channels a step. One column block up to 256 output channels, so the
# activation is computed once per element. The fused launch beats the three it replaces up to MAX_CHANNELS;
# wider units keep the three launches (the activation is small there and each column block recomputes it).
CONFIG = {"BLOCK_M": 32, "MAX_BLOCK_N": 256, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
MAX_CHANNELS = 192
FEW_ROWS = 2048  # up to a 1-frame piece of one row (1920 rows at 96 channels): 16-row tiles, more programs


def plan(rows: int, c: int) -> dict | None:
    """Launch config for `rows` rows of width c, or None where the three separate launches measured faster."""
    if c > MAX_CHANNELS:
        return None
    if rows <= FEW_ROWS:
        return {**CONFIG, "BLOCK_M": 16, "num_stages": 2}
    if c > 96:
        return {**CONFIG, "BLOCK_M": 128, "num_warps": 8}
    return CONFIG


def snake_conv1x1(h, freq, inv_mag, h_bias, weight, bias, x, x_bias=None, pdl=False, config=None):
    """h [B, L, C], x [B, L, C_out] (rows contiguous, any batch stride), weight [C_out, C] row-major, the rest
    [C] / [C_out] contiguous, all of h's dtype -> a new contiguous [B, L, C_out] (as `reference`)."""
    b, length, c = h.shape
    n = weight.shape[0]
    require(weight.shape == (n, c) and weight.stride() == (c, 1), f"weight must be a row-major [{n}, {c}]")
    require(x.shape == (b, length, n), f"residual {tuple(x.shape)} for output [{b}, {length}, {n}]")
    vectors = [(freq, c), (inv_mag, c), (h_bias, c), (bias, n), (x_bias, n)]
    require(all(v is None or (v.shape == (size,) and v.is_contiguous() and v.dtype == h.dtype) for v, size in vectors),
            "snake_conv1x1 vectors must be contiguous, of the activation's dtype and width")
    require(_fits(h, n), "snake_conv1x1 activation overflows int32 offsets")
    h, x = rows_contiguous(h), rows_contiguous(x)
    out = torch.empty(b, length, n, dtype=h.dtype, device=h.device)
    rows = b * length
    if not rows:
        return out
    cfg = {**(plan(rows, c) or CONFIG), **(config or {})}
    block_n = max(16, min(next_pow2(n), cfg["MAX_BLOCK_N"]))  # tl.dot takes 16 columns at least
    grid = (-(-rows // cfg["BLOCK_M"]) * -(-n // block_n),)
    _kernel()[grid](h, h.stride(0), freq, inv_mag, h_bias if h_bias is not None else freq, weight,
                    bias if bias is not None else freq, x, x.stride(0), x_bias if x_bias is not None else freq, out,
                    rows, length, C=c, N=n, HAS_HB=h_bias is not None, HAS_BIAS=bias is not None,
                    HAS_XB=x_bias is not None, FAST_SIN=h.dtype in snake.FAST_SIN_DTYPES,
                    IEEE=h.dtype == torch.float32 or interpreting(),
                    EMULATE_RNE=emulate_rne(h.dtype),
                    BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
                    num_stages=cfg["num_stages"], **launch_options(pdl))
    return out
