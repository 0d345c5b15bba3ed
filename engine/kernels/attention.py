"""Decode attention for one query token over a fixed window of the static cache, in one launch
(replaces scores matmul + scaled bias add + softmax + probs @ V).

q [B, nh, D]; k_cache, v_cache [B, nkv, S, D]; bias [W] additive (0 / -inf) over the first W positions,
shared by every row, or [B, 1, 1, W] (rows at different positions).
Scores are rounded to the activation dtype and the scaled bias add rounded again, as in the torch path;
softmax in fp32; the probabilities are not rounded before the V product (the torch path rounds them to
the dtype; the split path's optional tensor-core products do too), so bf16 results differ from the
reference by a few ulps.

Two launch shapes, chosen by `plan` (pure Python):
  * short windows (the code predictor's 16 positions): one program per (row, kv head) handles that
    head's nh / nkv query heads and streams the window in blocks with an online softmax in fp32;
  * long windows (the talker's 256..2048+): split-KV ("flash-decoding"). Grid (B, nkv, splits); each
    program streams one contiguous chunk of the window and writes its fp32 partial (running max m,
    sum l, unnormalised acc [G, D]) to a workspace; the program that arrives last at the (row, kv head)
    counter combines every split in a fixed order (deterministic) and writes the output, then re-arms
    the counter (graph replays included), as linear.py's split-K does. A split whose positions are
    all masked (a row shorter than the window) leaves m = -inf, l = 0 and weighs nothing in the
    combine; masked positions are not read from the caches at all.
    Without a bias (`device_length`) the split path reads each row's length from its position on the
    device instead of a window: one grid serves every length up to the caches' room, so a CUDA graph
    captured once holds for all of them (the talker's frame graphs: one per row count, not one per window).
"""
from __future__ import annotations

import functools

import torch

from . import counters as arrivals
from . import emulate_rne, interpreting
from . import qk_norm_rope_kv as kq
from ._util import next_pow2, require, sm_count
from .attention_plan import CONFIG, FUSE_MIN_ROWS, SPLIT_MIN_WINDOW, plan
from .pdl import launch_options

__all__ = ["CONFIG", "FUSE_MIN_ROWS", "SPLIT_MIN_WINDOW", "attention", "plan", "position_bias", "reference",
           "rope_attention", "rope_reference"]

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _pdl_enter = _round = _rope_q_kv = _attend_window = _split_m = _split_l_acc = _finite_top = None

def position_bias(pos, rows: int, room: int, dtype) -> torch.Tensor:
    """The additive mask [rows, 1, 1, room] of rows that attend positions 0..pos (pos one a row, or one for all)."""
    seen = torch.arange(room, device=pos.device)[None] <= pos.reshape(-1, 1)
    return torch.where(seen, 0.0, float("-inf")).to(dtype).expand(rows, room)[:, None, None]


def reference(q, k_cache, v_cache, bias, scale, pos=None):
    """The torch ops this kernel replaces in FusedLayer.step: q [B, nh, D] -> out [B, nkv, g, D]
    (reshape to [B, nh * D]). bias None: each row attends the cache positions 0..pos (`position_bias`)."""
    b, nh, d = q.shape
    nkv = k_cache.shape[1]
    if bias is None:
        bias = position_bias(pos, b, k_cache.shape[2], q.dtype)
    window = bias.shape[-1]
    scores = torch.matmul(q.reshape(b, nkv, nh // nkv, d), k_cache[:, :, :window].transpose(-1, -2))
    probs = torch.softmax(torch.add(bias, scores, alpha=scale), dim=-1)
    return torch.matmul(probs, v_cache[:, :, :window])


def rope_reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv):
    """The two ops `rope_attention` fuses: qk_norm_rope_kv.reference (writes the caches at pos), then
    `reference` over the window -> [B, nkv, g, D]."""
    q = kq.reference(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv)
    return reference(q, k_cache, v_cache, bias, scale, pos=pos)


@functools.cache
def _kernel():
    global triton, tl, _pdl_enter, _round, _rope_q_kv, _attend_window, _split_m, _split_l_acc, _finite_top
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()
    kq._kernel()
    _rope_q_kv, _round = kq._rope_q_kv, kq._round

    @triton.jit
    def _attend_window(q, k, v, bias, scale, dt: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """Query heads q [G, D] over a whole window k, v [S, D] (fp32, S a power of two) with the additive
        bias [S] (-inf masks, padding included) -> [G, D] in fp32, in one tile (no online softmax): scores
        rounded to dt, the scaled bias add rounded again, softmax in fp32, probabilities unrounded. For the
        kernels that hold a short window at once (attention_o_proj)."""
        sc = _round(tl.sum(q[:, None, :] * k[None, :, :], axis=2), dt, EMULATE_RNE).to(tl.float32)
        sc = _round(bias[None, :] + scale * sc, dt, EMULATE_RNE).to(tl.float32)
        p = tl.exp(sc - tl.max(sc, axis=1)[:, None])
        return tl.sum(p[:, :, None] * v[None, :, :], axis=1) / tl.sum(p, axis=1)[:, None]

    # The split partials, as the combine reads them (written by other programs: .cg, past L1). s: split
    # indices, ok: the real ones; the others read as m = -inf, l = 0, acc = 0 and weigh nothing.
    @triton.jit
    def _split_m(ml_base, s, ok, ci, GP: tl.constexpr):  # running maxima [S, GP]
        return tl.load(ml_base + s[:, None] * 2 * GP + ci[None, :], mask=ok[:, None], other=float("-inf"),
                       cache_modifier=".cg")

    @triton.jit
    def _split_l_acc(ml_base, acc_base, s, ok, ci, di, GP: tl.constexpr, D: tl.constexpr):  # [S, GP], [S, GP, D]
        lsum = tl.load(ml_base + s[:, None] * 2 * GP + GP + ci[None, :], mask=ok[:, None], other=0.0,
                       cache_modifier=".cg")
        acc = tl.load(acc_base + (s * GP * D)[:, None, None] + ci[None, :, None] * D + di[None, None, :],
                      mask=ok[:, None, None], other=0.0, cache_modifier=".cg")
        return lsum, acc

    @triton.jit
    def _finite_top(m):  # the maximum over splits; 0 for a fully masked row (0 / 0 as the reference)
        top = tl.max(m, axis=0)
        return tl.where(top == float("-inf"), 0.0, top)

    # ROPE: q_ptr is the qkv projection, not q. Each program first makes its query heads from it (q/k norm
    # and RoPE), and the program that owns position pos writes that token's k and v into the caches
    # (_rope_q_kv): qk_norm_rope_kv's work, without its launch. rope_args: qk-norm weight, cos, sin, pos
    # pointers, pos and cos row strides (0: shared by all rows), eps.
    @triton.jit
    def attention_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, out_ptr, stride_qb, skb, skh, sks, svb, svh, svs,
                         stride_ob, stride_bias, W, scale, qkn_ptr, cos_ptr, sin_ptr, pos_ptr, stride_pos,
                         stride_cos, eps, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                         BLOCK_N: tl.constexpr, ROPE: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr,
                         EMULATE_RNE: tl.constexpr, PDL: tl.constexpr):
        _pdl_enter(PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        dt = out_ptr.dtype.element_ty
        gi = tl.arange(0, GP)
        di = tl.arange(0, D)
        gmask = gi < G
        if ROPE:
            pos = tl.load(pos_ptr + b * stride_pos)
            q = _rope_q_kv(q_ptr, qkn_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, b, h, pos, True, stride_qb, stride_cos,
                           skb, skh, sks, svb, svh, svs, eps, G, GP, NH, NKV, D, dt, EMULATE_RNE).to(tl.float32)
        else:
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

    @triton.jit
    def split_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, out_ptr, acc_ptr, ml_ptr, count_ptr,
                     stride_qb, skb, skh, sks, svb, svh, svs, stride_ob, stride_bias, W, chunk, want, scale,
                     qkn_ptr, cos_ptr, sin_ptr, pos_ptr, stride_pos, stride_cos, eps, share_ptr, stride_share,
                     G: tl.constexpr, GP: tl.constexpr, R: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                     SP: tl.constexpr, SB: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr,
                     ROPE: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, EMULATE_RNE: tl.constexpr,
                     SHARE: tl.constexpr, DEVICE_LENGTH: tl.constexpr, PDL: tl.constexpr):
        _pdl_enter(PDL)  # q, caches, bias, workspace and counters are all read after the wait
        b = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        nkv = tl.num_programs(1)
        splits = tl.num_programs(2)  # the workspace's splits a (row, kv head)
        if DEVICE_LENGTH:  # the row attends positions 0..pos, read here: its length spread over `want` programs
            limit = tl.minimum(tl.load(pos_ptr + b * stride_pos) + 1, W)
            chunk = tl.cdiv(tl.maximum(chunk, tl.cdiv(limit, want)), BLOCK_N) * BLOCK_N  # `chunk`: the least
            used = tl.cdiv(limit, chunk)  # <= splits (plan); the others have nothing to do
            if sp >= used:
                return
        else:
            limit = W
            used = splits
        dt = out_ptr.dtype.element_ty
        gi = tl.arange(0, R)  # query heads of this kv head, padded to R rows
        di = tl.arange(0, D)
        gmask = gi < G
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, limit)
        end = hi  # the loop's end: a rope split knows its row's position, and stops after it (the rest is masked)
        if ROPE:  # the split holding pos writes the token's k / v (the last one if pos is past the window)
            pos = tl.load(pos_ptr + b * stride_pos)
            owner = (pos >= lo) & ((pos < hi) | (sp == used - 1))
            end = tl.minimum(hi, pos + 1)
            if lo <= pos:  # a split wholly past the row's position neither makes the query nor reads the caches
                q = _rope_q_kv(q_ptr, qkn_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, b, h, pos, owner, stride_qb,
                               stride_cos, skb, skh, sks, svb, svh, svs, eps, G, R, NH, NKV, D, dt, EMULATE_RNE)
            else:
                q = tl.zeros([R, D], dtype=dt)
        else:
            q = tl.load(q_ptr + b * stride_qb + (h * G + gi[:, None]) * D + di[None, :], mask=gmask[:, None],
                        other=0.0)
        m_i = tl.full([R], float("-inf"), tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D], tl.float32)
        if SHARE:  # positions below `shared` are read from row `source` (the same prompt's identical K/V)
            source = tl.load(share_ptr + b).to(tl.int32)
            shared = tl.load(share_ptr + stride_share + b).to(tl.int32)
        else:
            source = b
            shared = 0
        k_head = k_ptr + h * skh
        v_head = v_ptr + h * svh
        for start in range(lo, end, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            if DEVICE_LENGTH:  # no bias tensor: the positions past the row's length are the masked ones
                bias = tl.where(n < hi, 0.0, float("-inf"))
            else:
                bias = tl.load(bias_ptr + b * stride_bias + n, mask=n < hi, other=float("-inf")).to(tl.float32)
            live = bias != float("-inf")  # masked positions (and those past the chunk) are not read
            row = tl.where(n < shared, source, b)[:, None]
            k = tl.load(k_head + row * skb + n[:, None] * sks + di[None, :], mask=live[:, None], other=0.0)
            v = tl.load(v_head + row * svb + n[:, None] * svs + di[None, :], mask=live[:, None], other=0.0)
            if USE_DOT:
                if IEEE:
                    s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
            else:
                s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [R, BLOCK_N]
            s = s.to(dt).to(tl.float32)
            s = (bias[None, :] + scale * s).to(dt).to(tl.float32)  # -inf where masked
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if USE_DOT:
                if IEEE:
                    pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p.to(dt), v)
            else:
                pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        # The partial of the first GP rows (the query heads, padded to a power of two; tensor-core padding
        # rows beyond are not kept): acc [GP, D], then m [GP] and l [GP].
        pair = b * nkv + h
        slot = pair * splits + sp
        keep = gi < GP
        tl.store(acc_ptr + slot * GP * D + gi[:, None] * D + di[None, :], acc, mask=keep[:, None])
        tl.store(ml_ptr + slot * 2 * GP + gi, m_i, mask=keep)
        tl.store(ml_ptr + slot * 2 * GP + GP + gi, l_i, mask=keep)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(count_ptr + pair, 1, sem="acq_rel")
        if arrived == used - 1:  # the last arrival combines all splits in a fixed order
            ci = tl.arange(0, GP)
            ml_base = ml_ptr + pair * splits * 2 * GP
            acc_base = acc_ptr + pair * splits * GP * D
            if DEVICE_LENGTH:  # the grid's SP fits every length; this row's own count decides
                at_once = used <= SB
            else:
                at_once = SP <= SB
            if at_once:  # every split's m, l and acc in one round of loads (they do not depend on each other)
                sa = tl.arange(0, SB)  # == SP where SP <= SB
                sok = sa < used
                m_all = _split_m(ml_base, sa, sok, ci, GP)
                l_all, a_all = _split_l_acc(ml_base, acc_base, sa, sok, ci, di, GP, D)
                wgt = tl.exp(m_all - _finite_top(m_all)[None, :])  # [SB, GP]; 0 for masked splits
                l_sum = tl.sum(wgt * l_all, axis=0)
                total = tl.sum(wgt[:, :, None] * a_all, axis=0)
            else:  # the maxima first, then the splits SB at a time
                si = tl.arange(0, SP)
                m_top = _finite_top(_split_m(ml_base, si, si < used, ci, GP))
                l_sum = tl.zeros([GP], tl.float32)
                total = tl.zeros([GP, D], tl.float32)
                sj = tl.arange(0, SB)
                for s0 in range(0, used, SB):
                    sidx = s0 + sj
                    sok = sidx < used
                    lb, ab = _split_l_acc(ml_base, acc_base, sidx, sok, ci, di, GP, D)
                    wgt = tl.exp(_split_m(ml_base, sidx, sok, ci, GP) - m_top[None, :])
                    l_sum += tl.sum(wgt * lb, axis=0)
                    total += tl.sum(wgt[:, :, None] * ab, axis=0)
            out = total / l_sum[:, None]
            tl.store(out_ptr + b * stride_ob + (h * G + ci[:, None]) * D + di[None, :], out.to(dt),
                     mask=(ci < G)[:, None])
            tl.atomic_xchg(count_ptr + pair, 0)  # re-arm for the next launch

    return attention_kernel, split_kernel


def attention(q, k_cache, v_cache, bias, scale, block_n: int = 16, pdl: bool = False, chunk: int | None = None,
              config=None, share=None, pos=None, counters=None, plan_rows=None):
    """Same contract as reference: returns [B, nkv, g, D] (contiguous, so .view(B, nh * D) is free).

    chunk / config: see `plan` (None: the plan's choice for this device). share: see `_launch`. bias None:
    each row attends positions 0..pos (a long tensor, one a row or one for all), read on the device.
    counters: the engine's arrival counters (counters.py; None: the shared set). plan_rows: see `_launch`."""
    d = q.shape[2]
    q = q if q.stride(-1) == 1 and q.stride(1) == d else q.contiguous()
    lengths = None
    if bias is None:
        require(pos is not None and pos.numel() in (1, q.shape[0]) and pos.device == q.device
                and not pos.is_floating_point(), "attention without a bias takes pos: one position or one a row")
        lengths = (pos, pos.stride(0) if pos.numel() > 1 else 0)
    return _launch(q, q.shape[1], k_cache, v_cache, bias, scale, None, block_n, pdl, chunk, config, share, lengths,
                   counters, plan_rows)


def rope_attention(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv,
                   block_n: int = 16, pdl: bool = False, chunk: int | None = None, config=None, share=None,
                   counters=None, plan_rows=None):
    """qk_norm_rope_kv then attention in one launch; same arguments and results as `rope_reference`
    (qkv [B, (nh + 2 nkv) * D] or [B, 1, ...], pos one position or one per row, cos / sin to match)."""
    b = qkv.shape[0]
    qkv2, cos, sin_signed, d = kq._inputs(qkv, qk_norm_weight, cos, sin_signed, k_cache, v_cache, nh, nkv)
    per_row = kq._rows_at_own_positions(b, pos, cos, sin_signed)
    require(nkv == k_cache.shape[1], "the caches hold nkv heads")
    rope = (qk_norm_weight, cos, sin_signed, pos, 1 if per_row else 0, d if per_row else 0, float(eps))
    return _launch(qkv2, nh, k_cache, v_cache, bias, scale, rope, block_n, pdl, chunk, config, share,
                   counters=counters, plan_rows=plan_rows)


def bias_row_stride(bias, b: int) -> int:
    """The stride between rows of `bias` as the kernels read it: its window for one row each ([B, 1, 1, W]),
    0 for one shared by every row ([W] or [1, 1, 1, W])."""
    return bias.shape[-1] if bias.dim() > 1 and bias.shape[0] == b > 1 else 0


def _launch(q, nh, k_cache, v_cache, bias, scale, rope, block_n, pdl, chunk, config, share=None, lengths=None,
            counters=None, plan_rows=None):
    """q: [B, nh, D] rows (rope None), or qkv rows [B, (nh + 2 nkv) * D] with rope's tensors and strides.

    bias None: each row attends positions 0..its position (rope's pos, else `lengths`: (pos, row stride)). One
    launch shape then serves every length up to the caches' room (plan's device_length), so a graph captured
    once holds for all of them.

    share: None, or an integer tensor [2, >= B]: row b reads cache positions below share[1, b] from row
    share[0, b] instead of its own. Takes of one prompt hold identical copies of its K/V (one prefill copied
    into every row), so pointing them all at one copy gives the same result while the GPU reads the prompt's
    K/V from memory once instead of once a row (the other rows hit L2). The split path honours it; the
    one-program path (windows below SPLIT_MIN_WINDOW) reads each row's own copy.

    plan_rows: cut the window as for this many rows (at least B; None: B). The cut decides each row's sum order,
    so with one value for every call a row's result is the same bits whatever the other rows."""
    b = q.shape[0]
    nkv, d = k_cache.shape[1], k_cache.shape[-1]
    g = nh // nkv
    device_length = bias is None
    window = k_cache.shape[2] if device_length else bias.shape[-1]
    require(k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and (device_length or bias.is_contiguous()),
            "contiguous caches and bias")
    out = torch.empty(b, nkv, g, d, dtype=q.dtype, device=q.device)
    require(plan_rows is None or plan_rows >= b, "plan_rows at least the rows")
    p = plan(plan_rows or b, nkv, window, sm_count(q.device), chunk, config, block_n, fused=rope is not None,
             device_length=device_length)
    single, split = _kernel()
    args = (q.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], out.stride(0),
            0 if device_length else bias_row_stride(bias, b), window)
    if rope is not None:
        rope_args = rope
    elif lengths is not None:
        rope_args = (q, q, q, lengths[0], lengths[1], 0, 0.0)
    else:
        rope_args = (q, q, q, q, 0, 0, 0.0)
    bias = q if device_length else bias  # a placeholder pointer: the kernel reads no bias
    flags = {"ROPE": rope is not None, "NH": nh, "NKV": nkv,
             "EMULATE_RNE": emulate_rne(q.dtype)}
    if p["splits"] == 1 and not device_length:
        single[(b, nkv)](q, k_cache, v_cache, bias, out, *args, float(scale), *rope_args, G=g,
                         GP=max(next_pow2(g), 1), D=d, BLOCK_N=p["BLOCK_N"], **flags, num_warps=p["num_warps"],
                         **launch_options(pdl))
        return out
    gp = next_pow2(g)
    dot = p["USE_DOT"] and d >= 16  # tensor-core products need 16+ wide heads (the tiny test checkpoints: 8)
    slots = b * nkv * p["splits"]
    part = torch.empty(slots, gp, d, dtype=torch.float32, device=q.device)
    ml = torch.empty(slots, 2, gp, dtype=torch.float32, device=q.device)
    counters = arrivals.of(counters, "attention", q.device)
    require(b * nkv <= counters.numel(), "split-kv counters for every (row, kv head)")
    if share is not None:
        require(share.dim() == 2 and share.shape[0] == 2 and share.shape[1] >= b and share.stride(1) == 1
                and not share.is_floating_point() and share.device == q.device,
                "share: an integer tensor [2, >= rows] on the caches' device (source row, shared length)")
    share_args = (share, share.stride(0)) if share is not None else (q, 0)
    split[(b, nkv, p["splits"])](
        q, k_cache, v_cache, bias, out, part, ml, counters, *args, p["chunk"], p["want"], float(scale), *rope_args,
        *share_args, SHARE=share is not None, DEVICE_LENGTH=device_length, G=g, GP=gp, R=max(16, gp) if dot else gp,
        D=d, BLOCK_N=p["BLOCK_N"], SP=p["SP"], SB=p["SB"], USE_DOT=dot,
        IEEE=q.dtype == torch.float32 or interpreting(), **flags, num_warps=p["num_warps"],
        num_stages=p["num_stages"], **launch_options(pdl))
    return out
