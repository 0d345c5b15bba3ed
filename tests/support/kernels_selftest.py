"""Checks of every kernel against its plain-torch reference, shared by tests/kernels/test_kernels.py (CPU,
Triton interpreter) and tests/gpu/test_kernels_gpu.py (CUDA). Run on a GPU box with
`python -m tests.support.kernels_selftest` for a quick pass over all shape classes.

Tolerances (per element, |got - want| <= atol + rtol * |want|), about two ulps of the dtype: the kernels
follow the torch path's rounding points, and what is left is the order of fp32 sums, rsqrt/exp
implementations and (attention only) the unrounded probabilities.
"""
from __future__ import annotations

import math

import torch

from engine.kernels._util import sm_count

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
# q/k after RoPE: a one-ulp difference of the normed value (sum order / rsqrt) survives the cancellation in
# q*cos + rot(q)*sin as an absolute error of about one ulp of the normed magnitude (|q| up to ~8 here)
ROPE_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1.6e-2, 2e-3), torch.bfloat16: (1.25e-1, 1.6e-2)}
# matmuls: fp32 sums over K up to 6144 in another order than cuBLAS / fp64 differ by ~1e-5 absolute
LINEAR_TOL = {**TOL, torch.float32: (5e-5, 5e-5)}
ATTN_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3.2e-2, 3.2e-2)}


def _verdict(ok, what: str) -> None:
    """A failed check (AssertionError, as assert_close raises), kept under `python -O` unlike assert."""
    if not ok:
        raise AssertionError(what)


def _close(got, want, tol, what):
    atol, rtol = tol
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(shape, dtype, device, seed, scale=1.0, shift=0.0):
    return (torch.randn(shape, generator=_gen(seed)) * scale + shift).to(dtype).to(device)


def check_rms_norm(device, dtype, m, n, seed=0):
    from engine.kernels import rms_norm as k

    x = _rand((m, 1, n), dtype, device, seed, 2.0)
    w = _rand((n,), dtype, device, seed + 1, 0.5, 1.0)
    _close(k.rms_norm(x, w, 1e-6), k.reference(x, w, 1e-6), TOL[dtype], f"rms_norm {dtype} M={m} N={n}")


def check_silu_mul(device, dtype, m, inter, seed=0):
    from engine.kernels import silu_mul as k

    x = _rand((m, 1, 2 * inter), dtype, device, seed, 3.0)
    _close(k.silu_mul(x), k.reference(x), TOL[dtype], f"silu_mul {dtype} M={m} I={inter}")


# SnakeBeta inputs of the real codec: (channels, samples) of each wave block at 1 and 32 frames
SNAKE_SHAPES = [(1536, 4), (768, 32), (384, 160), (192, 640), (96, 1920), (1536, 128), (96, 61440)]


def check_snake(device, dtype, b, c, length, seed=0, row_pad=0, bias=False, keep=0, tail=False, pad=0):
    """SnakeBeta: every step rounds where torch's expression rounds, so only the sine may differ (an ulp).
    x is time-major [B, L, C]; row_pad > 0: x is a slice of time (batch rows at a stride of (length + row_pad) * C),
    as after a folded conv; bias: a per-channel bias added first (a conv's, fused into the activation).
    keep / tail / pad: the result as a causal conv's input window, `keep` rows of context in front (a random
    tail, or zeros) and `pad` zero rows after; the context rows must be the tail's exactly."""
    from engine.kernels import snake as k

    x = _rand((b, length + row_pad, c), dtype, device, seed, 3.0)[:, :length]
    freq = _rand((c,), torch.float32, "cpu", seed + 1, 0.5).exp().to(dtype).to(device)
    inv_mag = (1.0 / (_rand((c,), torch.float32, "cpu", seed + 2, 0.5).exp() + 1e-9)).to(dtype).to(device)
    add = _rand((c,), dtype, device, seed + 3, 1.0) if bias else None  # a conv's bias, fused (bias=True)
    ctx = _rand((b, keep, c), dtype, device, seed + 4, 2.0) if tail else None
    window = {"keep": keep, "tail": ctx, "pad": pad}
    got, want = k.snake(x, freq, inv_mag, add, **window), k.reference(x, freq, inv_mag, add, **window)
    _verdict(got.shape == want.shape == (b, keep + length + pad, c) and got.dtype == want.dtype,
             f"snake shape/dtype {got.shape} {got.dtype}")
    _verdict(torch.equal(got[:, :keep], want[:, :keep]) and not got[:, keep + length:].any(),
             f"snake window: context rows are the tail's, padding rows zero (keep={keep}, pad={pad})")
    _close(got, want, TOL[dtype], f"snake {dtype} B={b} C={c} L={length} bias={bias} keep={keep} pad={pad}")
    return (got.float() - want.float()).abs().max().item()


# The wave blocks' residual units: (channels, samples) at 1 frame, and two longer runs
SNAKE_CONV1X1_SHAPES = [(768, 32), (384, 160), (192, 640), (96, 1920), (768, 100), (96, 333)]


def check_snake_conv1x1(device, dtype, b, c, length, seed=0, x_bias=False, row_pad=0):
    """A residual unit's second half, x [+ x_bias] + conv1x1(snake(h + h_bias)), against the torch ops.
    row_pad > 0: h and x are slices of time (batch rows at a stride), as a folded conv's and a transposed conv's
    outputs are."""
    from engine.kernels import snake_conv1x1 as k

    h = _rand((b, length + row_pad, c), dtype, device, seed, 3.0)[:, :length]
    x = _rand((b, length + row_pad, c), dtype, device, seed + 1, 2.0)[:, row_pad:]
    freq = _rand((c,), torch.float32, "cpu", seed + 2, 0.5).exp().to(dtype).to(device)
    inv_mag = (1.0 / (_rand((c,), torch.float32, "cpu", seed + 3, 0.5).exp() + 1e-9)).to(dtype).to(device)
    h_bias, bias = _rand((c,), dtype, device, seed + 4, 1.0), _rand((c,), dtype, device, seed + 5, 0.1)
    weight = _rand((c, c), dtype, device, seed + 6, c ** -0.5)
    xb = _rand((c,), dtype, device, seed + 7, 1.0) if x_bias else None
    args = (h, freq, inv_mag, h_bias, weight, bias, x, xb)
    got, want = k.snake_conv1x1(*args), k.reference(*args)
    _verdict(got.shape == want.shape == (b, length, c) and got.dtype == want.dtype and got.is_contiguous(),
             f"snake_conv1x1 shape/dtype {got.shape} {got.dtype}")
    # The SnakeBeta may differ from torch's by an ulp in some elements (snake.py) and the matmul sums in another
    # order than cuBLAS, so the conv's output y may move by ulps of its terms |a| |w|, and y + x rounds again; where
    # x + y cancels that is far more than an ulp of the sum. The bound scales with |x| + |y| and sum |a| |w|.
    base = (x if xb is None else x + xb).float()
    terms = k.snake.reference(h, freq, inv_mag, h_bias).float().abs() @ weight.float().abs().t()
    atol, rtol = LINEAR_TOL[dtype]
    err = (got.float() - want.float()).abs()
    bound = atol + rtol * (base.abs() + (want.float() - base).abs() + terms / 4)
    worst = (err - bound).flatten().argmax()
    _verdict(bool((err <= bound).all()), f"snake_conv1x1 {dtype} B={b} C={c} L={length} x_bias={x_bias}: "
             f"{int((err > bound).sum())} elements out of bounds, worst {err.flatten()[worst]:.3g} > "
             f"{bound.flatten()[worst]:.3g}")
    return err.max().item()


# Decode matmul shapes (N, K, prologue, residual, bias) of the 0.6B / 1.7B layers and heads: qkv and
# gate/up after their norms, o_proj and down_proj (SwiGLU in front) with the residual, predictor heads
# after the final norm, the talker's codec head, and the 1.7B small_to_mtp_projection (bias).
LINEAR_SHAPES = [(4096, 1024, "rms_norm", False, False), (6144, 1024, "rms_norm", False, False),
                 (1024, 2048, "none", True, False), (1024, 3072, "silu_mul", True, False),
                 (2048, 1024, "rms_norm", False, False), (3072, 1024, "none", False, False),
                 (4096, 2048, "rms_norm", False, False), (12288, 2048, "rms_norm", False, False),
                 (2048, 2048, "none", True, False), (2048, 6144, "silu_mul", True, False),
                 (1024, 2048, "none", False, True)]


# Deferred split-K sums (split_sum.py) as a decoder layer hands them on: (producer N, K, prologue) -> (consumer
# N, prologue): down_proj into the next layer's qkv, the talker's o_proj into gate/up; 0.6B, then 1.7B.
SPLIT_SUM_SHAPES = [((1024, 3072, "silu_mul"), (4096, "rms_norm")), ((1024, 2048, "none"), (6144, "rms_norm")),
                    ((2048, 6144, "silu_mul"), (4096, "rms_norm")), ((2048, 2048, "none"), (12288, "rms_norm"))]


def check_linear(device, dtype, m, n, k, prologue="none", residual=False, bias=False, seed=0, config=None,
                 target=None):
    from engine.kernels import linear as kl

    width = 2 * k if prologue == "silu_mul" else k
    x = _rand((m, 1, width), dtype, device, seed, 2.0 if prologue == "silu_mul" else 1.0)
    w = _rand((n, k), dtype, device, seed + 1, k ** -0.5)
    nw = _rand((k,), dtype, device, seed + 2, 0.2, 1.0) if prologue == "rms_norm" else None
    b = _rand((n,), dtype, device, seed + 3) if bias else None
    r = _rand((m, 1, n), dtype, device, seed + 4) if residual else None
    args = {"prologue": prologue, "norm_weight": nw, "eps": 1e-6, "bias": b, "residual": r}
    splits = kl.plan(m, n, k, config, target, prologue=prologue)["splits"]
    _close(kl.linear(x, w, **args, config=config, target=target), kl.exact(x, w, **args), LINEAR_TOL[dtype],
           f"linear {dtype} M={m} N={n} K={k} {prologue} residual={residual} bias={bias} splits={splits}")
    return splits


def check_split_sum(device, dtype, m, producer, consumer, seed=0, config=None, target=None) -> bool:
    """A residual linear `producer` (N, K, prologue) launched with defer, then the `consumer` (N', prologue) on
    its SplitSum: the consumer's output and the row it stores equal the finished launch's and the consumer's on
    it, bit for bit. Returns whether the producer split (an unsplit launch has no sum to leave)."""
    from engine.kernels import linear as kl
    from engine.kernels import split_sum

    n, k, prologue = producer
    n2, prologue2 = consumer
    glu = prologue == "silu_mul"
    x = _rand((m, 1, 2 * k if glu else k), dtype, device, seed, 2.0 if glu else 1.0)
    w = _rand((n, k), dtype, device, seed + 1, k ** -0.5)
    r = _rand((m, 1, n), dtype, device, seed + 2)
    w2 = _rand((n2, n), dtype, device, seed + 3, n ** -0.5)
    nw = _rand((n,), dtype, device, seed + 4, 0.2, 1.0) if prologue2 == "rms_norm" else None
    y = kl.linear(x, w, prologue=prologue, residual=r, config=config, target=target)
    left = kl.linear(x, w, prologue=prologue, residual=r, config=config, target=target, defer=True)
    if not isinstance(left, split_sum.SplitSum):
        return False
    what = f"split_sum {dtype} M={m} {producer} -> {consumer}"
    want = kl.linear(y, w2, prologue=prologue2, norm_weight=nw)
    got = kl.linear(left, w2, prologue=prologue2, norm_weight=nw)
    _verdict(torch.equal(got, want), what + ": the consumer's output differs")
    _verdict(torch.equal(left.out, y), what + ": the stored row differs from the finished launch's")
    return True


def rope_tables(d, pos, dtype, device, base=1_000_000.0):
    """cos and the signed sin (rotate_half(x) * sin == cat(x2, x1) * [-sin1, sin2]) as FusedStack.rope."""
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.cat([pos * inv, pos * inv])
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    half = d // 2
    return cos[None].to(device), torch.cat((-sin[:half], sin[half:]))[None].to(device)


def _decode_token_case(device, dtype, b, nh, nkv, d, seq, positions, pad, seed):
    """One decode token's inputs: qkv rows with a larger stride (pad columns after the v heads), q/k norm
    weights, cos / sin rows of `positions` (one, or one per row), caches filled with noise and a copy of them,
    and the positions as a device tensor -> (qkv, w, cos, sin, caches, their copy, pos)."""
    width = (nh + 2 * nkv) * d
    qkv = _rand((b, 1, width + pad), dtype, device, seed, 2.0)[..., :width]
    w = _rand((nh + nkv, d), dtype, device, seed + 1, 0.3, 1.0)
    tables = [rope_tables(d, x, dtype, device) for x in positions]
    cos, sin = torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])
    caches = [_rand((b, nkv, seq, d), dtype, device, seed + 2 + i) for i in range(2)]
    return qkv, w, cos, sin, caches, [c.clone() for c in caches], torch.tensor(positions, device=device)


def check_qk_norm_rope_kv(device, dtype, b, nh=16, nkv=8, d=128, seq=32, pos=7, pad=64, seed=0, per_row=False):
    """qkv rows with a larger stride (pad columns after the v heads), caches filled with noise. per_row:
    each row at its own position (pos, pos + 3, ...), with its own cos/sin row."""
    from engine.kernels import qk_norm_rope_kv as k

    positions = [pos + 3 * i for i in range(b)] if per_row else [pos]
    qkv, w, cos, sin, caches, mine, p = _decode_token_case(device, dtype, b, nh, nkv, d, seq, positions, pad, seed)
    want = k.reference(qkv, w, cos, sin, 1e-6, caches[0], caches[1], p, nh, nkv)
    got = k.qk_norm_rope_kv(qkv, w, cos, sin, 1e-6, mine[0], mine[1], p, nh, nkv)
    what = f"qk_norm_rope_kv {dtype} B={b}{' per-row positions' if per_row else ''}"
    _close(got, want, ROPE_TOL[dtype], what + " q")
    _close(mine[0], caches[0], ROPE_TOL[dtype], what + " k_cache")
    _verdict(torch.equal(mine[1], caches[1]), what + " v_cache differs")


def check_qk_norm_rope_kv_prefill(device, dtype, t, nh=16, nkv=8, d=128, seq=None, seed=0):
    """T prompt tokens at positions 0..T-1 into a batch-1 cache filled with noise (positions past T keep it)."""
    from engine.kernels import qk_norm_rope_kv as k

    width = (nh + 2 * nkv) * d
    qkv = _rand((t, width), dtype, device, seed, 2.0)
    w = _rand((nh + nkv, d), dtype, device, seed + 1, 0.3, 1.0)
    tables = [rope_tables(d, x, dtype, device) for x in range(t)]
    cos, sin = torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])
    caches = [_rand((1, nkv, seq or t + 8, d), dtype, device, seed + 2 + i) for i in range(2)]
    mine = [c.clone() for c in caches]
    want = k.prefill_reference(qkv, w, cos, sin, 1e-6, caches[0], caches[1], nh, nkv)
    got = k.prefill(qkv, w, cos, sin, 1e-6, mine[0], mine[1], nh, nkv)
    what = f"qk_norm_rope_kv prefill {dtype} T={t}"
    _close(got, want, ROPE_TOL[dtype], what + " q")
    _close(mine[0], caches[0], ROPE_TOL[dtype], what + " k_cache")
    _verdict(torch.equal(mine[1], caches[1]), what + " v_cache differs")


def _shared_prefix(cache, share):
    """What a row reads under `share` ([(source row, length)] a row, attention._launch): a copy of the cache
    whose row b holds row source's values below length."""
    out = cache.clone()
    for row, (source, length) in enumerate(share):
        out[row, :, :length] = cache[source, :, :length]
    return out


def _share_tensor(share, device):
    return None if share is None else torch.tensor(share, device=device).t().contiguous()


def check_attention(device, dtype, b, nh=16, nkv=8, d=128, seq=64, window=16, filled=9, seed=0, block_n=16,
                    per_row=False, lengths=None, chunk=None, config=None, share=None, device_length=False):
    """per_row: row i sees `filled - i` positions (a [B, 1, 1, W] bias, rows of different lengths);
    lengths: each row's own count of visible positions instead (per-row bias). chunk / config: the
    launch plan (attention.plan; None: the plan's choice). share: [(source row, length)] a row, which the
    kernel gets while the reference reads caches whose prefixes were copied that way (the rows' own prefixes
    differ, so a kernel that ignored it fails). device_length: no bias; the kernel gets each row's last
    position (its count - 1) and reads it on the device, over all `seq` positions of the caches (`window` is
    unused). Returns the plan that ran."""
    from engine.kernels import attention as k

    q = _rand((b, nh, d), dtype, device, seed)
    kc = _rand((b, nkv, seq, d), dtype, device, seed + 1)
    vc = _rand((b, nkv, seq, d), dtype, device, seed + 2)
    pos = None
    if device_length:
        counts = lengths if lengths is not None else [max(1, filled - i) for i in range(b)] if per_row else [filled]
        pos, bias, window = torch.tensor(counts, device=device) - 1, None, seq
    elif per_row or lengths is not None:
        seen = lengths if lengths is not None else [max(1, filled - i) for i in range(b)]
        seen = torch.tensor(seen)[:, None]
        bias = torch.where(torch.arange(window)[None] < seen, 0.0, float("-inf"))[:, None, None]
        bias = bias.to(dtype).to(device)
    else:
        bias = torch.where(torch.arange(window) < filled, 0.0, float("-inf")).to(dtype).to(device)
    scale = d ** -0.5
    launch = k.plan(b, nkv, window, sm_count(torch.device(device)), chunk, config, block_n,
                    device_length=device_length)
    seen_k, seen_v = (kc, vc) if share is None else (_shared_prefix(kc, share), _shared_prefix(vc, share))
    _close(k.attention(q, kc, vc, bias, scale, block_n=block_n, chunk=chunk, config=config,
                       share=_share_tensor(share, device), pos=pos),
           k.reference(q, seen_k, seen_v, bias, scale, pos=pos), ATTN_TOL[dtype],
           f"attention {dtype} B={b} W={window} splits={launch['splits']} chunk={launch['chunk']} "
           f"device_length={device_length}")
    return launch


def check_rope_attention(device, dtype, b, nh=16, nkv=8, d=128, seq=32, window=16, pos=9, seed=0, per_row=False,
                         chunk=None, pad=64, config=None, share=None, device_length=False):
    """The fused q/k norm + RoPE + cache write + attention against the two reference ops: the output, and
    both caches after the write. per_row: row i at position pos - i with its own RoPE row and bias row
    (it sees positions 0..pos - i). chunk / config: the launch plan (attention.plan). share: as check_attention
    (lengths at most each row's position; the kernel's caches keep their own prefixes, the reference's are
    copied). device_length: no bias, each row's length read from its position on the device, over all `seq`
    positions (`window` unused). Returns the plan that ran."""
    from engine.kernels import attention as k

    positions = [max(0, pos - i) for i in range(b)] if per_row else [pos]
    qkv, w, cos, sin, caches, mine, p = _decode_token_case(device, dtype, b, nh, nkv, d, seq, positions, pad, seed)
    if share is not None:
        caches = [_shared_prefix(c, share) for c in caches]
    seen = torch.tensor(positions)[:, None] + 1
    bias = torch.where(torch.arange(window)[None] < seen, 0.0, float("-inf")).to(dtype)
    bias = (bias[:, None, None] if per_row else bias[0]).contiguous().to(device)
    if device_length:
        bias, window = None, seq
    scale = d ** -0.5
    want = k.rope_reference(qkv, w, cos, sin, 1e-6, caches[0], caches[1], p, bias, scale, nh, nkv)
    got = k.rope_attention(qkv, w, cos, sin, 1e-6, mine[0], mine[1], p, bias, scale, nh, nkv, chunk=chunk,
                           config=config, share=_share_tensor(share, device))
    if share is not None:  # the prefixes the kernel read elsewhere are still each row's own: compare the rest
        mine = [_shared_prefix(c, share) for c in mine]
    launch = k.plan(b, nkv, window, sm_count(torch.device(device)), chunk, config, fused=True,
                    device_length=device_length)
    what = (f"rope_attention {dtype} B={b} W={window} pos={positions} splits={launch['splits']} "
            f"device_length={device_length}")
    _close(got, want, ATTN_TOL[dtype], what + " out")
    _close(mine[0], caches[0], ROPE_TOL[dtype], what + " k_cache")
    _verdict(torch.equal(mine[1], caches[1]), what + " v_cache differs")
    return launch


def check_attention_o_proj(device, dtype, b, nh=16, nkv=8, d=128, seq=32, window=16, pos=9, n=1024, seed=0,
                           per_row=False, pad=64, config=None, defer=False):
    """q/k norm + RoPE + cache write + attention + o_proj with the residual in one launch, against the
    reference ops: the output, and both caches after the write. per_row: row i at position pos - i with its
    own RoPE and bias rows. config: attention_o_proj.CONFIG overrides. defer: the launch again with its sum
    left for the next linear (split_sum.py), whose sum must be the finished launch's output, bit for bit."""
    from engine.kernels import attention_o_proj as k

    positions = [max(0, pos - i) for i in range(b)] if per_row else [pos]
    qkv, w, cos, sin, caches, mine, p = _decode_token_case(device, dtype, b, nh, nkv, d, seq, positions, pad, seed)
    seen = torch.tensor(positions)[:, None] + 1
    bias = torch.where(torch.arange(window)[None] < seen, 0.0, float("-inf")).to(dtype)
    bias = (bias[:, None, None] if per_row else bias[0]).contiguous().to(device)
    wo = _rand((n, nh * d), dtype, device, seed + 5, (nh * d) ** -0.5)
    res = _rand((b, 1, n), dtype, device, seed + 6)
    scale = d ** -0.5
    want = k.reference(qkv, w, cos, sin, 1e-6, caches[0], caches[1], p, bias, scale, nh, nkv, wo, res)
    got = k.attention_o_proj(qkv, w, cos, sin, 1e-6, mine[0], mine[1], p, bias, scale, nh, nkv, wo, res,
                             config=config)
    what = f"attention_o_proj {dtype} B={b} W={window} pos={positions}"
    _close(got, want, ATTN_TOL[dtype], what + " out")
    if defer:
        from engine.kernels import split_sum

        left = k.attention_o_proj(qkv, w, cos, sin, 1e-6, mine[0], mine[1], p, bias, scale, nh, nkv, wo, res,
                                  config=config, defer=True)
        _verdict(torch.equal(split_sum.reference(left), got), what + " deferred sum differs from the finished one")
    _close(mine[0], caches[0], ROPE_TOL[dtype], what + " k_cache")
    _verdict(torch.equal(mine[1], caches[1]), what + " v_cache differs")


# ------------------------------------------------------------------------------------------------
# sampling


def sampling_case(device, b, vocab, seed, *, do_sample=True, temperature=0.9, top_k=50, top_p=1.0,
                  scale=3.0, ties=False, dtype=torch.float32):
    from engine.kernels import sample as ksample

    logits = torch.randn(b, vocab, generator=_gen(seed)) * scale
    if ties:  # quantised logits: many exact ties (top-k keeps them all; top-p boundary ties may differ)
        logits = (logits * 2).round() / 2
    logits = logits.to(dtype)
    f32 = {"device": device, "dtype": torch.float32}
    settings = (torch.tensor(do_sample, device=device), torch.tensor(temperature, **f32),
                torch.tensor(ksample.kth_index(top_k, vocab), device=device), torch.tensor(top_p, **f32))
    return logits.to(device), settings


def race_margin(logits, settings, u, ids_a, ids_b):
    """Relative gap between the reference race values of two ids (a near-tie explains a flip)."""
    _do_sample, temperature, k_index, _top_p = settings
    x = logits.float() / temperature
    s, _order = torch.sort(x, dim=-1, descending=True)
    kth = s.gather(-1, k_index.view(1, 1).expand(x.shape[0], 1))
    probs = torch.softmax(x.masked_fill(x < kth, float("-inf")), -1)
    race = probs / -torch.log(u)
    ra, rb = race.gather(-1, ids_a[:, None])[:, 0], race.gather(-1, ids_b[:, None])[:, 0]
    return ((ra - rb).abs() / torch.maximum(ra, rb).clamp_min(1e-30))


def check_sample_exact(device, b, vocab, seed=0, rng="u", max_flips=0, **case):
    """Ids equal to sample.choose on every row (rows that differ must be race near-ties)."""
    from engine import sampling
    from engine.kernels import sample as k

    logits, settings = sampling_case(device, b, vocab, seed, **case)
    keys = sampling.take_keys(seed, range(b), device)
    step = torch.tensor([3 + seed], device=device)
    slot = seed % 16
    u = sampling.uniforms(keys, step.reshape(()), slot, vocab)
    want = k.reference(logits, *settings, u=u)
    if rng == "u":
        got = k.sample(logits, *settings, u=u)
    else:
        got = k.sample(logits, *settings, keys=keys, step=step, slot=slot)
    bad = got != want
    if bad.any():
        margin = race_margin(logits, settings, u, got, want)[bad]
        _verdict(int(bad.sum()) <= max_flips and bool((margin < 1e-5).all()),
                 f"sample V={vocab} {case}: {int(bad.sum())} of {b} rows differ (race margins {margin.tolist()})")


def check_sample_penalty(device, b, vocab=3072, seed=0, do_sample=True, t=1, min_new=2, per_row=False):
    """Codebook 0 in one launch: penalty + suppression + in-kernel uniforms + seen / finished update.
    per_row: every row at its own frame (t + i), on both sides of min_new."""
    from engine import sampling
    from engine.kernels import sample as k

    logits, settings = sampling_case(device, b, vocab, seed, do_sample=do_sample, top_p=0.8)
    logits = logits.to(torch.bfloat16)  # the head's dtype: the kernel converts, the reference calls .float()
    g = _gen(seed + 7)
    seen = (torch.rand(b, vocab, generator=g) < 0.05).to(device)
    eos_id = vocab - 1024 + 2
    banned = sampling.control_mask(vocab, eos_id, device)
    eos_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    eos_mask[eos_id] = True
    if do_sample:  # make EOS likely so that finished flips on some rows
        logits[: b // 2, eos_id] = 8.0
    f32 = {"device": device, "dtype": torch.float32}
    steps = torch.tensor([t + i for i in range(b)] if per_row else [t], device=device)
    common = {"keys": sampling.take_keys(seed, range(b), device), "step": steps, "slot": 0,
              "penalty": torch.tensor(1.3, **f32), "banned": banned, "eos_mask": eos_mask,
              "t": steps if per_row else steps.reshape(()), "min_new": torch.tensor(min_new, device=device),
              "update": True}
    ref_seen, ref_fin = seen.clone(), torch.zeros(b, dtype=torch.bool, device=device)
    want = k.reference(logits, *settings, seen=ref_seen, finished=ref_fin, **common)
    my_seen, my_fin = seen.clone(), torch.zeros(b, dtype=torch.bool, device=device)
    got = k.sample(logits, *settings, seen=my_seen, finished=my_fin, **common)
    _verdict(torch.equal(got, want), f"penalised sample differs: {got.tolist()} vs {want.tolist()}")
    _verdict(torch.equal(my_seen, ref_seen) and torch.equal(my_fin, ref_fin),
             "penalised sample: seen or finished differ")


def check_sample_per_row_settings(device, vocab=3072, seed=0, penalty=True):
    """Rows with settings of their own in one launch ([B] settings: greedy and sampled rows, other temperatures,
    top-k, top-p, penalties and min_new) equal each row sampled alone with its settings as 0-d tensors, for the
    kernel and for the torch reference; the ids, seen and finished alike."""
    from engine import sampling
    from engine.kernels import sample as k

    rows = [  # do_sample, temperature, top_k, top_p, penalty, min_new
        (True, 0.9, 50, 1.0, 1.05, 2), (False, 0.9, 50, 1.0, 1.0, 0), (True, 1.7, 0, 0.8, 1.3, 5),
        (True, 0.4, 3, 1.0, 1.0, 0), (True, 1.0, 0, 0.6, 2.0, 9), (False, 0.7, 20, 0.9, 1.5, 3)]
    b = len(rows)
    logits = (torch.randn(b, vocab, generator=_gen(seed)) * 3.0).to(device)
    eos_id = vocab - 1024 + 2
    logits[::2, eos_id] = 9.0  # EOS likely where min_new lets it through
    f32 = {"device": device, "dtype": torch.float32}
    cols = list(zip(*rows))
    table = (torch.tensor(cols[0], device=device), torch.tensor(cols[1], **f32),
             torch.tensor([k.kth_index(x, vocab) for x in cols[2]], device=device), torch.tensor(cols[3], **f32))
    seen = (torch.rand(b, vocab, generator=_gen(seed + 3)) < 0.05).to(device)
    steps = torch.tensor([4] * b, device=device)
    keys = sampling.take_keys(seed, range(b), device)
    banned = sampling.control_mask(vocab, eos_id, device)
    eos_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    eos_mask[eos_id] = True

    def run(fn, r, settings, pen, min_new):
        extra = {}
        if penalty:
            extra = {"penalty": pen, "seen": seen[r].clone(), "banned": banned, "eos_mask": eos_mask, "t": steps[r],
                     "min_new": min_new, "finished": torch.zeros(len(range(b)[r]), dtype=torch.bool, device=device),
                     "update": True}
        ids = fn(logits[r], *settings, keys=keys[r], step=steps[r], slot=0, **extra)
        return ids, extra.get("seen"), extra.get("finished")

    for name, fn in (("kernel", k.sample), ("reference", k.reference)):
        together = run(fn, slice(None), table, torch.tensor(cols[4], **f32), torch.tensor(cols[5], device=device))
        for i in range(b):
            alone = run(fn, slice(i, i + 1), tuple(x[i] for x in table), torch.tensor(cols[4][i], **f32),
                        torch.tensor(cols[5][i], device=device))
            for got, want in zip(together, alone):
                _verdict(got is None or torch.equal(got[i: i + 1], want),
                         f"{name}: row {i} with its own settings differs from itself alone")


def check_sample_into_slots(device, b, vocab=2048, width=40, seed=0):
    """out_ids / out_rows: the sampler writes the ids and the embedding rows into strided views (a column of the
    frame's codes, a slot of its rows), as frame_graph.frame_body passes them, and leaves the rest untouched."""
    from engine import sampling
    from engine.kernels import sample as k

    logits, settings = sampling_case(device, b, vocab, seed)
    draw = {"keys": sampling.take_keys(seed, range(b), device), "step": torch.tensor([3], device=device), "slot": 2}
    table = _rand((vocab, width), torch.bfloat16, device, seed + 1)
    want = k.reference(logits, *settings, **draw)
    for fn in (k.sample, k.reference):
        codes = torch.full((b, 16), -1, dtype=torch.long, device=device)
        rows = torch.zeros(b, 16, width, dtype=torch.bfloat16, device=device)
        ids, got = fn(logits, *settings, **draw, embed=table, out_ids=codes[:, 5], out_rows=rows[:, 5])
        what = f"sample into slots ({fn.__name__})"
        _verdict(torch.equal(codes[:, 5], want) and torch.equal(ids, want), what + ": ids")
        _verdict(torch.equal(rows[:, 5], table[want]) and torch.equal(got, table[want]), what + ": rows")
        _verdict(bool((codes[:, :5] == -1).all() and (codes[:, 6:] == -1).all()), what + ": other codes written")
        _verdict(rows[:, :5].abs().sum().item() == 0 and rows[:, 6:].abs().sum().item() == 0,
                 what + ": other rows written")


# (rows, hidden, rope width) of the frame graph: the 0.6B and 1.7B talkers at 1 and 16 takes
FRAME_GLUE_SHAPES = [(1, 1024, 128), (16, 1024, 128), (1, 2048, 128), (16, 2048, 128)]


def check_talker_input(device, dtype, b, hidden, d, groups=16, seed=0, exact_sums=False):
    """frame_glue.talker_input against its torch reference. exact_sums: embedding values on a 2^-6 grid, so every
    fp32 sum is exact whatever its order, and the results must be the same bits; else within TOL (the order
    of the fp32 additions may differ from torch's)."""
    from engine.kernels import frame_glue as k

    g = _gen(seed)
    if exact_sums:
        rows = (torch.randint(-64, 65, (b, groups, hidden), generator=g) / 64.0).to(dtype).to(device)
    else:
        rows = _rand((b, groups, hidden), dtype, device, seed, 0.05)
    room = 7
    trailing = _rand((b * room, hidden), dtype, device, seed + 1)
    start = (torch.arange(b) * room).to(device)
    t = torch.randint(0, 2 * room, (b,), generator=g).to(device)
    last = torch.randint(0, room, (b,), generator=g).to(device)
    table = (_rand((300, d), dtype, device, seed + 2), _rand((300, d), dtype, device, seed + 3))
    pos = torch.randint(0, 300, (b,), generator=g).to(device)
    x, cos, sin = k.talker_input(rows, trailing, start, t, last, table, pos)
    want_x, want_cos, want_sin = k.talker_input_reference(rows, trailing, start, t, last, table, pos)
    what = f"talker_input {dtype} B={b} H={hidden}"
    _verdict(torch.equal(cos, want_cos) and torch.equal(sin, want_sin), what + ": the RoPE rows differ")
    if exact_sums:
        _verdict(torch.equal(x, want_x), what + ": the input differs on exact sums")
    else:
        _close(x, want_x, TOL[dtype], what)


def check_frame_tail(device, dtype, b, hidden, seed=0):
    """frame_glue.frame_tail against its torch reference: the final norm (within TOL, as rms_norm) from a strided
    view, and every row's bookkeeping exactly, with rows finished before, finishing on their budget and going on."""
    from engine.kernels import frame_glue as k

    g = _gen(seed)
    out = _rand((b, hidden + 8), dtype, device, seed, 2.0)[:, :hidden]  # a row stride wider than the row
    w = _rand((hidden,), dtype, device, seed + 1, 0.2, 1.0)
    finished = (torch.arange(b) % 3 == 0).to(device)
    t = torch.randint(0, 9, (b,), generator=g).to(device)
    limit = t + torch.randint(0, 3, (b,), generator=g).to(device)  # some rows reach their budget this frame
    pos = torch.randint(10, 90, (b,), generator=g).to(device)
    state = [torch.zeros(b, hidden, dtype=dtype, device=device), finished, torch.zeros_like(finished), t, limit, pos]
    mine = [v.clone() for v in state]
    k.frame_tail_reference(out, w, 1e-6, *state)
    k.frame_tail(out, w, 1e-6, *mine)
    what = f"frame_tail {dtype} B={b} H={hidden}"
    _close(mine[0], state[0], TOL[dtype], what)
    for name, got, want in zip(("finished", "valid", "t", "limit", "pos"), mine[1:], state[1:]):
        _verdict(torch.equal(got, want), f"{what}: {name} {got.tolist()} vs {want.tolist()}")
    if b >= 6:  # the case covers rows finished before, finishing now and going on
        _verdict(bool(state[1].any() and (~state[1]).any() and (state[3] < state[4]).any()),
                 what + ": the case needs finished and running rows")


def check_sample_distribution(device, draws, vocab=2048, seed=0, top_k=6, top_p=0.9, temperature=0.8):
    """Chi-square of the kernel's draws (one row per draw, per-take uniforms) against the reference
    sampler's kept distribution; returns the p-value's statistic and asserts it below the 0.999 quantile."""
    from engine import sampling
    from engine.kernels import sample as ksample
    from engine.kernels import sample as k

    row = torch.randn(1, vocab, generator=_gen(seed)) * 1.5
    logits = row.expand(draws, vocab).contiguous().to(device)
    f32 = {"device": device, "dtype": torch.float32}
    settings = (torch.tensor(True, device=device), torch.tensor(temperature, **f32),
                torch.tensor(ksample.kth_index(top_k, vocab), device=device), torch.tensor(top_p, **f32))
    keys = sampling.take_keys(seed, range(draws), device)
    got = k.sample(logits, *settings, keys=keys, step=torch.tensor([0], device=device), slot=1).cpu()
    # expected: the reference filter (HF semantics) then softmax
    probs = torch.softmax(sampling.filter_top_k_top_p(row / temperature, top_k, top_p), -1)[0].double()
    support = torch.nonzero(probs > 0)[:, 0]
    _verdict(bool(torch.isin(got, support).all()), "drew an id outside the kept set")
    counts = torch.bincount(got, minlength=vocab).double()[support]
    expected = probs[support] * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = len(support) - 1
    # Wilson-Hilferty 0.999 quantile of chi-square(dof)
    z = 3.090
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    _verdict(chi2 < limit,
             f"chi-square {chi2:.1f} >= {limit:.1f} (dof {dof}): {counts.tolist()} vs {expected.tolist()}")
    return chi2, dof


def run_all(device="cuda", verbose=True):
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    for dt in dtypes:
        for m in (1, 4, 8, 16):
            for n in (1024, 2048):
                check_rms_norm(device, dt, m, n)
            check_silu_mul(device, dt, m * 4, 3072)
            check_qk_norm_rope_kv(device, dt, m)
            for w in (16, 256, 1024):
                check_attention(device, dt, m, seq=max(64, w), window=w, filled=w - 3, block_n=64)
                check_rope_attention(device, dt, m, seq=max(64, w), window=w, pos=w - 3 - m, per_row=m > 1)
            if m <= 2:
                check_attention_o_proj(device, dt, m, per_row=m > 1, defer=m == 1)
            for n, k, prologue, residual, bias in LINEAR_SHAPES:
                check_linear(device, dt, m, n, k, prologue, residual, bias)
            for producer, consumer in SPLIT_SUM_SHAPES:
                check_split_sum(device, dt, m, producer, consumer)
        for c, length in SNAKE_SHAPES:
            check_snake(device, dt, 1, c, length)
        for c, length in SNAKE_CONV1X1_SHAPES:
            check_snake_conv1x1(device, dt, 2, c, length, x_bias=True, row_pad=3)
    for vocab in (2048, 3072):
        for case in ({"do_sample": False}, {}, {"top_k": 0}, {"top_p": 0.8}, {"top_k": 1},
                     {"top_k": 20, "top_p": 0.5, "temperature": 1.3}, {"top_k": 0, "top_p": 0.95, "scale": 1.0}):
            check_sample_exact(device, 256, vocab, max_flips=2, **case)
            check_sample_exact(device, 64, vocab, rng="hash", max_flips=1, **case)
    check_sample_penalty(device, 16)
    check_sample_penalty(device, 16, do_sample=False, t=5)
    chi2, dof = check_sample_distribution(device, 200_000, top_k=50, top_p=0.95)
    if verbose:
        print(f"all kernel checks passed on {device} (chi-square {chi2:.1f}, dof {dof})")


# Sampling settings every kernel test checks (CPU interpreter and GPU alike).
SAMPLE_CASES = {
    "greedy": {"do_sample": False},
    "default": {},
    "no_top_k": {"top_k": 0},
    "top_p": {"top_p": 0.8},
    "top_k_1": {"top_k": 1},
    "k20_p05_t13": {"top_k": 20, "top_p": 0.5, "temperature": 1.3},
    "p095_flat": {"top_k": 0, "top_p": 0.95, "scale": 1.0},
    "ties": {"top_k": 30, "ties": True},
    # bf16 logits: the heads' output, searched on 16-bit keys; ties at the top-k boundary are common. Not
    # with top-p: its boundary ties are as common, and there the sort keeps an arbitrary subset.
    "bf16": {"dtype": torch.bfloat16},
    "bf16_k20_t13": {"top_k": 20, "temperature": 1.3, "dtype": torch.bfloat16},
}


def predictor_stack(device, dtype, hidden=128, inter=256, layers=2, nh=4, nkv=2, d=32, seed=0, rope_theta=1e6,
                    std=None):
    """A random decoder stack (FusedStack) with the code predictor's structure, at any size: norm weights
    around 1, matrices N(0, std) (default hidden ** -0.5)."""
    from engine.config import LayerStackConfig
    from engine.gpu.fused_layers import FusedStack
    from engine.model.layers import DecoderStack

    cfg = LayerStackConfig(hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=nh,
                           num_kv_heads=nkv, head_dim=d, rms_norm_eps=1e-6, rope_theta=rope_theta,
                           max_position_embeddings=64, vocab_size=16)
    torch.manual_seed(seed)
    stack = DecoderStack(cfg)
    with torch.no_grad():
        for p in stack.parameters():
            torch.nn.init.normal_(p, 1.0 if p.ndim == 1 else 0.0, 0.1 if p.ndim == 1 else std or hidden ** -0.5)
    return FusedStack(stack.to(device=device, dtype=dtype))


if __name__ == "__main__":
    run_all()
