"""The codec's SnakeBeta activation, x + inv_mag * sin(x * freq)^2 with per-channel freq / inv_mag, in one launch.

torch runs it as five elementwise kernels (x*freq, sin, pow, mul, add: each reads and writes the whole
activation). Rounding: every step is computed in fp32 and rounded to x.dtype where torch's expression in
engine/codec/decoder.SnakeBeta rounds (after x*freq, after sin, after the square, after the product, after
the sum; in fp32 these are no-ops), and the sine is libdevice sinf (tl.sin is sin.approx). It is not bit for
bit torch's CUDA result: measured on an H200 (bench/codec_piece_bench.py --snake-exactness), about 15% of
elements differ by one ulp of the output (fp32: <= 9.5e-7; bf16: one bf16 ulp); the rest are equal. Under
the interpreter (CPU tests) bf16 matches torch's CPU expression exactly.

freq = exp(alpha) and inv_mag = 1 / (exp(beta) + 1e-9) come precomputed in x.dtype (SnakeBeta.params).
"""
from __future__ import annotations

import functools

import torch

from . import interpreting
from ._util import require
from .pdl import launch_options

triton = tl = _sin = _round = _to_fp32 = _pdl_enter = None  # bound on first use by _kernel()

BLOCK = 1024  # elements a program (4 warps, 8 per thread)


def reference(x: torch.Tensor, freq: torch.Tensor, inv_mag: torch.Tensor) -> torch.Tensor:
    """x [B, L, C] (time-major, the codec decoder's layout); freq, inv_mag [C] in x.dtype: SnakeBeta's torch
    expression."""
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

    @triton.jit(do_not_specialize=["N", "C", "per_batch", "stride_batch"])  # one compile serves every shape
    def snake_kernel(x_ptr, freq_ptr, inv_ptr, out_ptr, N, C, per_batch, stride_batch, BLOCK: tl.constexpr,
                     EMULATE_RNE: tl.constexpr, PDL: tl.constexpr):
        _pdl_enter(PDL)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        b = offs // per_batch  # per_batch = L * C: a batch row may sit at its own stride (a slice of time)
        ch = offs % C
        dt: tl.constexpr = out_ptr.dtype.element_ty
        xf = tl.load(x_ptr + b * stride_batch + (offs - b * per_batch), mask=mask, other=0.0).to(tl.float32)
        f = tl.load(freq_ptr + ch, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(inv_ptr + ch, mask=mask, other=0.0).to(tl.float32)
        s = _to_fp32(_sin(_to_fp32(xf * f, dt, EMULATE_RNE)), dt, EMULATE_RNE)  # sin(x * freq), rounded as torch
        y = _to_fp32(m * _to_fp32(s * s, dt, EMULATE_RNE), dt, EMULATE_RNE)  # inv_mag * sin^2
        tl.store(out_ptr + offs, _round(xf + y, dt, EMULATE_RNE), mask=mask)

    return snake_kernel


def snake(x: torch.Tensor, freq: torch.Tensor, inv_mag: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [B, L, C] (time-major; each batch row's L * C values contiguous, at any batch stride, e.g. a slice of
    time; anything else is made contiguous); freq, inv_mag [C] contiguous, x.dtype -> new contiguous [B, L, C]."""
    b, length, c = x.shape
    require(freq.shape == (c,) and inv_mag.shape == (c,) and freq.is_contiguous() and inv_mag.is_contiguous(),
            f"snake params must be contiguous [{c}], got {tuple(freq.shape)} / {tuple(inv_mag.shape)}")
    require(freq.dtype == x.dtype and inv_mag.dtype == x.dtype, "snake params must have the activation's dtype")
    n = x.numel()
    require(n < 2 ** 31, f"snake input of {n} elements overflows int32 offsets")
    if not (x.stride(2) == 1 and x.stride(1) == c):
        x = x.contiguous()
    out = torch.empty(b, length, c, dtype=x.dtype, device=x.device)
    if n:
        grid = ((n + BLOCK - 1) // BLOCK,)
        _kernel()[grid](x, freq, inv_mag, out, n, c, length * c, x.stride(0), BLOCK=BLOCK,
                        EMULATE_RNE=x.dtype == torch.bfloat16 and interpreting(), num_warps=4,
                        **launch_options(pdl))
    return out
