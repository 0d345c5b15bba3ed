"""The codec's SnakeBeta activation, x + inv_mag * sin(x * freq)^2 with per-channel freq / inv_mag, in one launch.

torch runs it as five elementwise kernels (x*freq, sin, pow, mul, add: each reads and writes the whole
activation). Rounding: every step is computed in fp32 and rounded to x.dtype where torch's expression in
engine/codec/decoder.SnakeBeta rounds (after x*freq, after sin, after the square, after the product, after
the sum; in fp32 these are no-ops), and the sine is libdevice sinf (tl.sin is sin.approx). It is not bit for
bit torch's CUDA result: measured on an H200 (bench/codec_piece_bench.py --snake-exactness), about 15% of
elements differ by one ulp of the output (fp32: <= 9.5e-7; bf16: one bf16 ulp); the rest are equal. Under
the interpreter (CPU tests) bf16 matches torch's CPU expression exactly.

freq = exp(alpha) and inv_mag = 1 / (exp(beta) + 1e-9) come precomputed in x.dtype (SnakeBeta.params). An
optional per-channel bias (the previous conv's, which then leaves it out) is added first and rounded where
torch's add rounds. The activations are time-major [B, L, C] (the decoder's layout).
"""
from __future__ import annotations

import functools

import torch

from . import interpreting
from ._util import require
from .pdl import launch_options

triton = tl = _sin = _round = _to_fp32 = _pdl_enter = None  # bound on first use by _kernel()

TILE = 2048  # elements a program (4 warps, 16 per thread): 32 or 64 channels x 64 or 32 time steps


def reference(x: torch.Tensor, freq: torch.Tensor, inv_mag: torch.Tensor, bias: torch.Tensor | None = None
              ) -> torch.Tensor:
    """x [B, L, C] (time-major, the codec decoder's layout); freq, inv_mag [C] in x.dtype: SnakeBeta's torch
    expression; with `bias` [C], of x + bias (rounded to x.dtype first, as the conv's own bias add rounds)."""
    if bias is not None:
        x = x + bias
    return x + inv_mag * torch.sin(x * freq).pow(2)


@functools.cache
def _kernel():
    global triton, tl, _sin, _round, _to_fp32, _pdl_enter  # the interpreter resolves module globals
    import triton
    import triton.language as tl

    from . import linear as kl
    from .pdl import enter
    _pdl_enter = enter()
    kl._kernel()
    _round = kl._round  # fp32 -> dtype, round to nearest even (by hand where the interpreter's cast truncates)

    if interpreting():  # no libdevice (numpy's sin is correctly rounded anyway)
        @triton.jit
        def _sin(x):
            return tl.sin(x)
    else:
        from triton.language.extra import libdevice

        @triton.jit
        def _sin(x):
            return libdevice.sin(x)

    @triton.jit
    def _to_fp32(v, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """v rounded to the activation dtype, back in fp32 (where torch's expression rounds)."""
        return _round(v, dt, EMULATE_RNE).to(tl.float32)

    @triton.jit(do_not_specialize=["rows", "L", "C", "stride_batch"])  # one compile serves every shape
    def snake_kernel(x_ptr, freq_ptr, inv_ptr, bias_ptr, out_ptr, rows, L, C, stride_batch,
                     BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                     EMULATE_RNE: tl.constexpr, PDL: tl.constexpr):
        """A [BLOCK_T time steps, BLOCK_C channels] tile: the channel parameters load once per tile and the
        batch row once per time step (a per-element divide and modulo made the 1-D version instruction-bound)."""
        _pdl_enter(PDL)
        r = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # b * L + t
        ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        r_ok, ch_ok = r < rows, ch < C
        b = r // L
        src = (b * stride_batch + (r - b * L) * C)[:, None] + ch[None, :]
        mask = r_ok[:, None] & ch_ok[None, :]
        dt: tl.constexpr = out_ptr.dtype.element_ty
        xf = tl.load(x_ptr + src, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:  # the conv's bias, added and rounded where torch's add would round it
            xf = _to_fp32(xf + tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :], dt, EMULATE_RNE)
        f = tl.load(freq_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :]
        m = tl.load(inv_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :]
        s = _to_fp32(_sin(_to_fp32(xf * f, dt, EMULATE_RNE)), dt, EMULATE_RNE)  # sin(x * freq), rounded as torch
        y = _to_fp32(m * _to_fp32(s * s, dt, EMULATE_RNE), dt, EMULATE_RNE)  # inv_mag * sin^2
        tl.store(out_ptr + r[:, None] * C + ch[None, :], _round(xf + y, dt, EMULATE_RNE), mask=mask)

    return snake_kernel


def snake(x: torch.Tensor, freq: torch.Tensor, inv_mag: torch.Tensor, bias: torch.Tensor | None = None,
          pdl: bool = False) -> torch.Tensor:
    """x [B, L, C] (time-major; each batch row's L * C values contiguous, at any batch stride, e.g. a slice of
    time; anything else is made contiguous); freq, inv_mag and the optional bias [C] contiguous, x.dtype -> a
    new contiguous [B, L, C]."""
    b, length, c = x.shape
    params = (freq, inv_mag) if bias is None else (freq, inv_mag, bias)
    require(all(t.shape == (c,) and t.is_contiguous() for t in params),
            f"snake params must be contiguous [{c}], got {[tuple(t.shape) for t in params]}")
    require(all(t.dtype == x.dtype for t in params), "snake params must have the activation's dtype")
    n = x.numel()
    require(n < 2 ** 31, f"snake input of {n} elements overflows int32 offsets")
    if not (x.stride(2) == 1 and x.stride(1) == c):
        x = x.contiguous()
    out = torch.empty(b, length, c, dtype=x.dtype, device=x.device)
    if n:
        block_c = 64 if c % 64 == 0 else 32
        block_t = TILE // block_c
        grid = (-(-b * length // block_t), -(-c // block_c))
        _kernel()[grid](x, freq, inv_mag, freq if bias is None else bias, out, b * length, length, c, x.stride(0),
                        BLOCK_T=block_t, BLOCK_C=block_c, HAS_BIAS=bias is not None,
                        EMULATE_RNE=x.dtype == torch.bfloat16 and interpreting(), num_warps=4,
                        **launch_options(pdl))
    return out
