"""Fused graph-safe sampling of one id per row in one launch (replaces ~22 kernels per choose, and for
codebook 0 also the penalty / suppression / seen / finished kernels and the uniforms).

Semantics are exactly `choose` below (the torch path), with every setting a device tensor, 0-d (every row)
or [B] (one per row: rows of one decode loop may sample differently), so changing one never forces a graph's
recapture:
greedy argmax when not do_sample; else x = logits / temperature, top-k keeps ids with x >= the value
at sorted position k_index (ties kept), probabilities are the softmax over those, top-p keeps the
smallest prefix of the descending order whose mass reaches p (the first always kept), and the id is the
exponential race argmax p_i / -log(u_i).

No sort: the k-th largest value and the top-p cut are searched over order-preserving integer keys of the
row held in registers, skipped at run time when top-k or top-p is disabled; the whole sampled branch is
skipped when do_sample is false. Both are bisections, one row-wide count / masked sum a step. The keys
are those of x in float32 (32 bits); for bf16 logits without the penalty they are those of the bf16
logits (16 bits: at most 16 steps where tied logits keep top-k from stopping early). x = logits /
temperature ranks distinct bf16 values the same way, because float32 division cannot round two values
2^-8 apart together (unless it overflows or falls below float32's normal range).

Differences from the torch path: only at exact ties of values at the top-p boundary (the kernel keeps
every tied id; the sort keeps an arbitrary subset) and ulp-level rounding of the probabilities (a
different summation order), which can flip a race that is tied to ~1e-7 relative.

Optional, folded in the same launch:
  * uniforms from the per-take counter hash (engine.sampling.uniforms(keys, step, slot, V)), bit-exact;
  * codebook-0 logits processing of frame_graph.frame_body: repetition penalty on `seen`, suppression
    of `banned | (eos_mask & (t < min_new))`;
  * the bookkeeping after the draw: seen[row, id] = True and finished[row] |= eos_mask[id].
"""
from __future__ import annotations

import functools

import torch

from ._util import next_pow2, require
from .pdl import launch_options

triton = tl = libdevice = _exp = _log = _mix32 = _order_key = _copy_row = _pdl_enter = None  # bound by _kernel()


def kth_index(top_k: int, vocab: int) -> int:
    """Sorted position of the k-th largest logit (top_k = 0 or >= vocab keeps everything)."""
    return min(top_k, vocab) - 1 if top_k > 0 else vocab - 1


def choose(logits, do_sample, temperature, k_index, top_p, u, first, out=None):
    """logits [B, V] float32, u [B, V] uniforms in (0, 1) -> ids [B] (written into `out` when given).

    Settings are 0-d (every row) or [B] (row b's); k_index: long from kth_index(); first: bool [B, V] with only
    column 0 set (a static buffer).
    """
    b = logits.shape[0]
    greedy = torch.argmax(logits, dim=-1)
    sorted_logits, order = torch.sort(logits / temperature.reshape(-1, 1), dim=-1, descending=True)
    kth = sorted_logits.gather(-1, k_index.reshape(-1, 1).expand(b, 1))
    keep = sorted_logits >= kth
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    keep = keep & ((mass_before < top_p.reshape(-1, 1)) | first)
    race = (probs * keep) / (-torch.log(u.gather(-1, order)))
    sampled = order.gather(-1, torch.argmax(race, dim=-1, keepdim=True)).squeeze(-1)
    if out is None:
        return torch.where(do_sample.reshape(-1), sampled, greedy)
    return torch.where(do_sample.reshape(-1), sampled, greedy, out=out)


def reference(logits, do_sample, temperature, k_index, top_p, *, u=None, keys=None, step=None, slot=0,
              first=None, penalty=None, seen=None, banned=None, eos_mask=None, t=None, min_new=None,
              finished=None, update=False, embed=None, embed2=None, out_ids=None, out_rows=None):
    """The torch ops of frame_graph.frame_body / choose (the off path and the oracle)."""
    from .. import sampling

    logits = logits.float()
    if penalty is not None:
        logits = sampling.penalize_repeats(logits, seen, penalty)
        mask = banned | (eos_mask & (t < min_new).reshape(-1, 1))  # t, min_new: one, or one per row
        logits = logits.masked_fill(mask, float("-inf"))
    b, vocab = logits.shape
    if u is None:
        u = sampling.uniforms(keys, step, slot, vocab)
    if first is None:
        first = torch.zeros(b, vocab, dtype=torch.bool, device=logits.device)
        first[:, 0] = True
    ids = choose(logits, do_sample, temperature, k_index, top_p, u, first, out=out_ids)
    if update:
        seen.scatter_(1, ids[:, None], True)
        finished |= eos_mask[ids]
    if embed is None:
        return ids
    if out_rows is None:
        rows = torch.nn.functional.embedding(ids, embed)
    else:
        rows = torch.index_select(embed, 0, ids, out=out_rows)
    return (ids, rows) if embed2 is None else (ids, rows, torch.nn.functional.embedding(ids, embed2))


@functools.cache
def _kernel():
    global triton, tl, _exp, _log, _mix32, _order_key, _copy_row, _pdl_enter  # the interpreter resolves globals
    import triton
    import triton.language as tl

    from .pdl import enter
    _pdl_enter = enter()

    from . import interpreting

    if interpreting():  # the interpreter has no libdevice; numpy's exp / log are correctly rounded anyway
        @triton.jit
        def _exp(x):
            return tl.exp(x)

        @triton.jit
        def _log(x):
            return tl.log(x)
    else:  # libdevice expf / logf, the functions torch's CUDA softmax and log call (tl.exp is ex2.approx)
        global libdevice
        from triton.language.extra import libdevice

        @triton.jit
        def _exp(x):
            return libdevice.exp(x)

        @triton.jit
        def _log(x):
            return libdevice.log(x)

    @triton.jit
    def _mix32(x):
        x = (x ^ (x >> 16)) * 0x7FEB352D
        x = (x ^ (x >> 15)) * 0x846CA68B
        return x ^ (x >> 16)

    @triton.jit
    def _order_key(x):  # -0.0 gets +0.0's key: they tie, as float comparison (and the torch path) has it
        bits = tl.where(x == 0.0, 0.0, x).to(tl.uint32, bitcast=True)
        return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)

    @triton.jit
    def _copy_row(table_ptr, idx, stride_table, out_ptr, stride_out, row, E, BLOCK_E: tl.constexpr):
        for e0 in range(0, E, BLOCK_E):
            ce = e0 + tl.arange(0, BLOCK_E)
            tl.store(out_ptr + row * stride_out + ce, tl.load(table_ptr + idx * stride_table + ce, mask=ce < E),
                     mask=ce < E)

    @triton.jit
    def sample_kernel(logits_ptr, stride_l, u_ptr, stride_u, ids_ptr, stride_ids,
                      do_sample_ptr, temp_ptr, kidx_ptr, top_p_ptr, stride_set,
                      keys_ptr, step_ptr, stride_step, slot,
                      penalty_ptr, seen_ptr, stride_seen, banned_ptr, eos_ptr, t_ptr, stride_t, min_new_ptr,
                      finished_ptr, emb_ptr, stride_emb, emb_out_ptr, stride_emb_out, E,
                      emb2_ptr, stride_emb2, emb2_out_ptr, stride_emb2_out, E2,
                      V, BLOCK: tl.constexpr, HAS_U: tl.constexpr, PENALTY: tl.constexpr, UPDATE: tl.constexpr,
                      EMBED: tl.constexpr, EMBED2: tl.constexpr, BLOCK_E: tl.constexpr, KEY_BITS: tl.constexpr,
                      PDL: tl.constexpr):
        _pdl_enter(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        valid = cols < V
        NEG = float("-inf")
        lg = tl.load(logits_ptr + row * stride_l + cols, mask=valid, other=NEG).to(tl.float32)
        if PENALTY:
            pen = tl.load(penalty_ptr + row * stride_set)
            hit = tl.where(lg > 0, tl.div_rn(lg, pen), lg * pen)
            seen = tl.load(seen_ptr + row * stride_seen + cols, mask=valid, other=0) != 0
            lg = tl.where(seen, hit, lg)
            early = tl.load(t_ptr + row * stride_t) < tl.load(min_new_ptr + row * stride_set)
            banned = tl.load(banned_ptr + cols, mask=valid, other=0) != 0
            eos = tl.load(eos_ptr + cols, mask=valid, other=0) != 0
            lg = tl.where(banned | (eos & early), NEG, lg)
            lg = tl.where(valid, lg, NEG)
        if tl.load(do_sample_ptr + row * stride_set) != 0:
            x = tl.div_rn(lg, tl.load(temp_ptr + row * stride_set))
            if KEY_BITS == 16:  # bf16 logits, no penalty: ranking the 16-bit logits ranks x (see the docstring)
                key = _order_key(lg) >> 16
            else:
                key = _order_key(x)
            kidx = tl.load(kidx_ptr + row * stride_set)
            # top-k: the largest key K with count(key >= K) >= kidx + 1 is the key at sorted position kidx.
            # Bisection, one bit a step. It stops early once a candidate keeps exactly kidx + 1 ids: then
            # {key >= cand} is already the top-k set, whatever the lower bits (so the same ids are kept);
            # with distinct logits that is after ~log2(V) + a few steps. Tied logits at the boundary
            # (common in bf16) take all KEY_BITS steps.
            kth = tl.full((), 0, tl.uint32)
            if kidx < V - 1:
                bit = tl.full((), 1 << (KEY_BITS - 1), tl.uint32)
                exact = tl.full((), 0, tl.int32)
                while (bit != 0) & (exact == 0):
                    cand = kth | bit
                    cnt = tl.sum(tl.where(valid & (key >= cand), 1, 0), axis=0)
                    kth = tl.where(cnt > kidx, cand, kth)
                    exact = (cnt == kidx + 1).to(tl.int32)
                    bit = bit >> 1
            keep = valid & (key >= kth)
            m = tl.max(tl.where(keep, x, NEG), axis=0)
            e = tl.where(keep, _exp(x - m), 0.0)
            p = tl.div_rn(e, tl.sum(e, axis=0))
            # top-p: the largest key K whose inclusive mass sum(p[key >= K]) reaches top_p; keep key >= K
            top_p = tl.load(top_p_ptr + row * stride_set)
            cut = tl.full((), 0, tl.uint32)
            if top_p < 1.0:
                bit = tl.full((), 1 << (KEY_BITS - 1), tl.uint32)
                for _ in range(KEY_BITS):
                    cand = cut | bit
                    mass = tl.sum(tl.where(keep & (key >= cand), p, 0.0), axis=0)
                    cut = tl.where(mass >= top_p, cand, cut)
                    bit = bit >> 1
            keep = keep & (key >= cut)
            if HAS_U:
                u = tl.load(u_ptr + row * stride_u + cols, mask=valid, other=0.5)
            else:
                k = tl.load(keys_ptr + row).to(tl.uint32)
                step = tl.load(step_ptr + row * stride_step).to(tl.uint32)
                base = _mix32(k + step * 0x9E3779B9 + (tl.full((), 0, tl.uint32) + slot) * 0x85EBCA6B)
                h = _mix32(_mix32(base ^ (cols.to(tl.uint32) * 0xC2B2AE35)) ^ k)
                u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            race = tl.where(keep, tl.div_rn(p, -_log(u)), 0.0)
            idx = tl.argmax(race, axis=0)
        else:
            idx = tl.argmax(lg, axis=0)  # greedy: first maximum
        tl.store(ids_ptr + row * stride_ids, idx.to(tl.int64))
        if EMBED:  # the chosen id's embedding row, the next step's input (saves a lookup launch)
            _copy_row(emb_ptr, idx, stride_emb, emb_out_ptr, stride_emb_out, row, E, BLOCK_E)
        if EMBED2:  # and its row of a second table (the 1.7B's projected copy: saves a projection launch)
            _copy_row(emb2_ptr, idx, stride_emb2, emb2_out_ptr, stride_emb2_out, row, E2, BLOCK_E)
        if UPDATE:
            tl.store(seen_ptr + row * stride_seen + idx, 1)
            fin = tl.load(finished_ptr + row) | tl.load(eos_ptr + idx)
            tl.store(finished_ptr + row, fin)

    return sample_kernel


# Warps of the one program per row, at every vocabulary: the bisection's row-wide passes are the cost, so
# more threads win.
WARPS = 16


def sample(logits, do_sample, temperature, k_index, top_p, *, u=None, keys=None, step=None, slot=0,
           penalty=None, seen=None, banned=None, eos_mask=None, t=None, min_new=None,
           finished=None, update=False, embed=None, embed2=None, out_ids=None, out_rows=None, pdl=False,
           warps=None):
    """logits [B, V] (fp32, or the head's dtype: converted inside) -> ids [B] long.

    Settings are device tensors (do_sample bool, temperature / top_p float32, k_index long from kth_index),
    all 0-d (every row) or all [B] (row b reads element b), penalty and min_new included. Uniforms: u [B, V] float32, or keys [B] long + step (1-elem long device
    tensor, or [B]: one frame index per row) + slot (int) to draw them inside.
    Codebook 0: penalty float32, seen [B, V] bool, banned / eos_mask [V] bool, t (1 or [B]) / min_new long;
    update=True also sets seen[row, id] and finished[row] |= eos_mask[id] (finished [B] bool).
    embed: an embedding table [V', E] (rows contiguous): also return its rows at the ids, (ids, [B, E]).
    embed2 (with embed): a second such table [V', E2], whose rows come last, (ids, [B, E], [B, E2]).
    out_ids [B] long / out_rows [B, E] (with embed): where the ids / the rows of `embed` go (views with any row
    stride, e.g. a column of the frame's codes); returned as they are.
    warps: the program's warp count (default WARPS)."""
    b, vocab = logits.shape
    require(logits.stride(-1) == 1, "contiguous logits rows")
    ids = out_ids if out_ids is not None else torch.empty(b, dtype=torch.long, device=logits.device)
    require(ids.dtype == torch.long and ids.shape == (b,), "out_ids [B] long")
    dummy = logits
    has_u = u is not None
    if has_u:
        require(u.dtype == torch.float32 and u.stride(-1) == 1 and u.shape[-1] >= vocab, "float32 uniforms [B, >= V]")
    else:
        require(keys is not None and step is not None, "give u, or keys + step (+ slot)")
    pen = penalty is not None
    if update:
        require(pen and finished is not None, "update needs the codebook-0 tensors (seen, eos_mask, finished)")

    def u8(x):
        return x.view(torch.uint8) if x is not None and x.dtype == torch.bool else x

    def per_row(x):  # a tensor with one value per row is read at row * 1, a shared one at offset 0
        return 1 if x is not None and x.numel() == b and b > 1 else 0

    settings = [do_sample, temperature, k_index, top_p] + ([penalty, min_new] if pen else [])
    stride_set = per_row(temperature)
    require(all(x.numel() in (1, b) for x in settings) and len({per_row(x) for x in settings}) == 1,
            "settings all 0-d or all [B]")
    require(embed2 is None or embed is not None, "embed2 comes with embed")
    require(out_rows is None or embed is not None, "out_rows comes with embed")
    outs, embedding = [], []
    for table, out in ((embed, out_rows), (embed2, None)):  # per table: itself, its row stride, the rows out,
        if table is None:                                    # their stride, width
            embedding += [dummy, 0, dummy, 0, 0]
            continue
        require(table.stride(-1) == 1, "contiguous embedding rows")
        if out is None:
            out = torch.empty(b, table.shape[1], dtype=table.dtype, device=table.device)
        require(out.shape == (b, table.shape[1]) and out.dtype == table.dtype and out.stride(-1) == 1,
                "out_rows [B, E] in the table's dtype, rows contiguous")
        outs.append(out)
        embedding += [table, table.stride(0), outs[-1], outs[-1].stride(0), table.shape[1]]
    block = next_pow2(vocab)
    key_bits = 16 if logits.dtype == torch.bfloat16 and not pen else 32  # see the module docstring
    _kernel()[(b,)](
        logits, logits.stride(0), u if has_u else dummy, u.stride(0) if has_u else 0, ids, ids.stride(0),
        u8(do_sample), temperature, k_index, top_p, stride_set,
        keys if keys is not None else ids, step if step is not None else ids, per_row(step), int(slot),
        penalty if pen else dummy, u8(seen) if pen else dummy, seen.stride(0) if pen else 0,
        u8(banned) if pen else dummy, u8(eos_mask) if pen else dummy, t if pen else ids,
        per_row(t) if pen else 0, min_new if pen else ids, u8(finished) if update else dummy,
        *embedding, vocab, BLOCK=block, HAS_U=has_u, PENALTY=pen, UPDATE=bool(update), EMBED=embed is not None,
        EMBED2=embed2 is not None, BLOCK_E=1024, KEY_BITS=key_bits, num_warps=warps or WARPS, **launch_options(pdl))
    return (ids, *outs) if outs else ids
