"""The codec's SnakeBeta activation, x + inv_mag * sin(x * freq)^2 with per-channel freq / inv_mag, in one launch.

torch runs it as five elementwise kernels (x*freq, sin, pow, mul, add: each reads and writes the whole
activation). Rounding: every step is computed in fp32 and rounded to x.dtype where torch's expression in
engine/codec/conv.SnakeBeta rounds (after x*freq, after sin, after the square, after the product, after
the sum; in fp32 these are no-ops). It is not bit for bit torch's CUDA result: a small share of elements
differ by one ulp of the output (docs/PERFORMANCE_NOTES.md); the rest are equal.

The sine: fp32 activations use libdevice sinf. bf16 / fp16 ones, rounded to 8 or 11 bits right after the sine,
use the hardware sine (sin.approx, absolute error ~5e-7 on [-pi, pi]) of the argument reduced to [-pi, pi]: the
accurate sinf's range reduction and polynomials make the wide codec pieces' SnakeBeta instruction-bound, and
after the rounding to 8 or 11 bits the two sines give the same outputs on codec-like activations. Under
the interpreter (CPU tests) the reduced argument goes to numpy's sine, so the reduction is what those tests check.

freq = exp(alpha) and inv_mag = 1 / (exp(beta) + 1e-9) come precomputed in x.dtype (SnakeBeta.params). An
optional per-channel bias (the previous conv's, which then leaves it out) is added first and rounded where
torch's add rounds. The activations are time-major [B, L, C] (the decoder's layout).

The launch can also write its result straight into the next causal conv's input window: the previous chunk's
last rows (the conv state's tail) in front, zero rows after up to the folded conv's multiple. That replaces the
torch.cat with the tail and the zero padding, each a full read and write of the activation.
"""
from __future__ import annotations

import functools

import torch

from . import emulate_rne, interpreting
from ._util import require, rows_contiguous
from .pdl import launch_options

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _sin = _sin_reduced = _hw_sin = _round = _to_fp32 = _plus_bias = _activate = _pdl_enter = None

# Activation dtypes whose sine is the hardware one of the reduced argument (see the module docstring); the
# rest (fp32) use libdevice sinf. Benches empty it to time the accurate sine.
FAST_SIN_DTYPES = (torch.bfloat16, torch.float16)

# TILE: elements a program (4 warps, 8 per thread): 32 or 64 channels x 32 or 16 time steps, the fastest tile at
# every width of the codec's pieces. `snake`'s config overrides these.
CONFIG = {"TILE": 1024, "num_warps": 4}


def reference(x: torch.Tensor, freq: torch.Tensor, inv_mag: torch.Tensor, bias: torch.Tensor | None = None,
              *, keep: int = 0, tail: torch.Tensor | None = None, pad: int = 0) -> torch.Tensor:
    """x [B, L, C] (time-major, the codec decoder's layout); freq, inv_mag [C] in x.dtype: SnakeBeta's torch
    expression (SnakeBeta runs this where the kernel does not); with `bias` [C], of x + bias (rounded to x.dtype
    first, as the conv's own bias add rounds).
    keep / tail / pad: the result with `keep` rows of context in front (tail [B, keep, C], or zeros) and `pad`
    zero rows after, [B, keep + L + pad, C]: the next causal conv's input."""
    if bias is not None:
        x = x + bias
    y = x + inv_mag * torch.sin(x * freq).pow(2)
    if not (keep or pad):
        return y
    b, _, c = y.shape
    front = tail if tail is not None else y.new_zeros(b, keep, c)
    return torch.cat([front, y, y.new_zeros(b, pad, c)], dim=1)


@functools.cache
def _kernel():
    global triton, tl, _sin, _sin_reduced, _hw_sin, _round, _to_fp32, _plus_bias, _activate, _pdl_enter
    import triton
    import triton.language as tl

    from . import linear as kl
    from .pdl import enter
    _pdl_enter = enter()
    kl._kernel()
    _round = kl._round  # fp32 -> dtype, round to nearest even (by hand where the interpreter's cast truncates)

    if interpreting():  # no libdevice and no PTX (numpy's sin is correctly rounded anyway)
        @triton.jit
        def _sin(x):
            return tl.sin(x)

        _hw_sin = _sin
    else:
        from triton.language.extra import libdevice

        @triton.jit
        def _sin(x):
            return libdevice.sin(x)

        @triton.jit
        def _hw_sin(r):
            return tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=f,f", [r], dtype=tl.float32,
                                             is_pure=True, pack=1)

    @triton.jit
    def _sin_reduced(x):
        """sin(x) for half-precision activations: x - k * 2pi in [-pi, pi] (two-constant Cody-Waite), then the
        hardware sine. 2pi = 6.28125 + 1.935307179586232e-3: the first has 8 significant bits, so k times it is
        exact for |k| < 2^16 (|x| up to ~4e5)."""
        k = tl.floor(x * 0.15915494309189535 + 0.5)
        r = x - k * 6.28125
        r = r - k * 1.935307179586232e-3
        return _hw_sin(r)

    @triton.jit
    def _to_fp32(v, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """v rounded to the activation dtype, back in fp32 (where torch's expression rounds)."""
        return _round(v, dt, EMULATE_RNE).to(tl.float32)

    @triton.jit
    def _plus_bias(vf, bias_ptr, ch, ch_ok, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """vf [rows, channels] (fp32, values of dt) plus a per-channel bias, rounded where torch's add rounds."""
        return _to_fp32(vf + tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :], dt, EMULATE_RNE)

    @triton.jit
    def _activate(xf, f, m, dt: tl.constexpr, FAST_SIN: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """SnakeBeta of xf (fp32, values of dt) with per-channel freq f and inv_mag m: x + m * sin(x * f)^2 in
        dt, rounded after every step where torch's expression rounds."""
        arg = _to_fp32(xf * f, dt, EMULATE_RNE)
        if FAST_SIN:
            s = _to_fp32(_sin_reduced(arg), dt, EMULATE_RNE)
        else:
            s = _to_fp32(_sin(arg), dt, EMULATE_RNE)
        y = _to_fp32(m * _to_fp32(s * s, dt, EMULATE_RNE), dt, EMULATE_RNE)  # inv_mag * sin^2
        return _round(xf + y, dt, EMULATE_RNE)

    @triton.jit(do_not_specialize=["rows", "L", "C", "stride_batch", "keep", "L_out"])  # one compile, any shape
    def snake_kernel(x_ptr, freq_ptr, inv_ptr, bias_ptr, tail_ptr, out_ptr, rows, L, C, stride_batch, keep, L_out,
                     BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_TAIL: tl.constexpr,
                     FAST_SIN: tl.constexpr, EMULATE_RNE: tl.constexpr, PDL: tl.constexpr):
        """A [BLOCK_T time steps, BLOCK_C channels] tile of out [B, L_out, C]: per batch row, `keep` rows of
        context (the tail, already activated; zeros without one), then the L activated rows of x, then zeros.
        The channel parameters load once per tile and the batch row once per time step (a per-element divide
        and modulo made the 1-D version instruction-bound)."""
        _pdl_enter(PDL)
        r = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # b * L_out + t
        ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        r_ok, ch_ok = r < rows, ch < C
        b = r // L_out
        t = r - b * L_out
        tx = t - keep  # the row of x, where 0 <= tx < L
        in_x = r_ok & (tx >= 0) & (tx < L)
        src = (b * stride_batch + tx * C)[:, None] + ch[None, :]
        mask = in_x[:, None] & ch_ok[None, :]
        dt: tl.constexpr = out_ptr.dtype.element_ty
        xf = tl.load(x_ptr + src, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:  # the conv's bias, added and rounded where torch's add would round it
            xf = _plus_bias(xf, bias_ptr, ch, ch_ok, dt, EMULATE_RNE)
        f = tl.load(freq_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :]
        m = tl.load(inv_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :]
        val = tl.where(mask, _activate(xf, f, m, dt, FAST_SIN, EMULATE_RNE), 0.0)  # context rows, end padding: 0
        if HAS_TAIL:  # the previous chunk's last `keep` rows, [B, keep, C] contiguous
            in_tail = (r_ok & (t < keep))[:, None] & ch_ok[None, :]
            ctx = tl.load(tail_ptr + (b * keep + t)[:, None] * C + ch[None, :], mask=in_tail, other=0.0)
            val = tl.where(in_tail, ctx, val)
        tl.store(out_ptr + r[:, None] * C + ch[None, :], val.to(dt), mask=r_ok[:, None] & ch_ok[None, :])

    return snake_kernel


def snake(x: torch.Tensor, freq: torch.Tensor, inv_mag: torch.Tensor, bias: torch.Tensor | None = None,
          pdl: bool = False, *, keep: int = 0, tail: torch.Tensor | None = None, pad: int = 0,
          config: dict | None = None) -> torch.Tensor:
    """x [B, L, C] (time-major; each batch row's L * C values contiguous, at any batch stride, e.g. a slice of
    time; anything else is made contiguous); freq, inv_mag and the optional bias [C] contiguous, x.dtype -> a
    new contiguous [B, L, C].

    keep / tail / pad lay the result out as the next causal conv's input (as `reference` does), in the same launch:
    [B, keep + L + pad, C] with the tail [B, keep, C] (zeros when None) in front and `pad` zero rows after.
    config overrides CONFIG."""
    cfg = {**CONFIG, **(config or {})}
    b, length, c = x.shape
    params = (freq, inv_mag) if bias is None else (freq, inv_mag, bias)
    require(all(t.shape == (c,) and t.is_contiguous() for t in params),
            f"snake params must be contiguous [{c}], got {[tuple(t.shape) for t in params]}")
    require(all(t.dtype == x.dtype for t in params), "snake params must have the activation's dtype")
    require(tail is None or (tail.shape == (b, keep, c) and tail.is_contiguous() and tail.dtype == x.dtype),
            f"snake tail must be a contiguous [{b}, {keep}, {c}] of the activation's dtype")
    length_out = keep + length + pad
    n = b * length_out * c
    require(max(n, x.numel()) < 2 ** 31, f"snake output of {n} elements overflows int32 offsets")
    x = rows_contiguous(x)
    out = torch.empty(b, length_out, c, dtype=x.dtype, device=x.device)
    if n:
        block_c = 64 if c % 64 == 0 else 32
        block_t = cfg["TILE"] // block_c
        grid = (-(-b * length_out // block_t), -(-c // block_c))
        _kernel()[grid](x, freq, inv_mag, freq if bias is None else bias, out if tail is None else tail, out,
                        b * length_out, length, c, x.stride(0), keep, length_out,
                        BLOCK_T=block_t, BLOCK_C=block_c, HAS_BIAS=bias is not None, HAS_TAIL=tail is not None,
                        FAST_SIN=x.dtype in FAST_SIN_DTYPES, EMULATE_RNE=emulate_rne(x.dtype),
                        num_warps=cfg["num_warps"], **launch_options(pdl))
    return out
