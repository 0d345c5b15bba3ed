"""A whole code-predictor pass (every decoder layer, then the final norm and one codebook head) in one
persistent launch.

Why: at decode the predictor's matmuls are 4-12 MB each, too small to fill the GPU for long, so the
per-layer path (engine/gpu/fused_layers.py: 6 launches a layer, 15 passes a frame) pays launch and ramp
on every op. Here one launch keeps a fixed set of programs resident and walks the phases

    per layer: qkv = rms_norm(x) @ Wqkv^T         (tiles of output columns)
               q/k norm + RoPE + cache write, attention over the window   (one tile per row x kv head)
               mid = x + attn @ Wo^T
               gu = rms_norm(mid) @ Wgu^T
               x = mid + silu(gate) * up @ Wdown^T
    then:      logits = rms_norm(x) @ Whead^T      (or nothing: a pass that only fills the cache)

with a grid-wide barrier between phases. Before waiting at a barrier each program asks L2 to prefetch
its weight rows of the next matmul, so HBM streams while the grid waits.

Deadlock safety: a barrier needs every program resident at once. The launcher sizes the grid from the
device (SM count x programs that fit per SM, from the compiled kernel's registers and shared memory)
and never exceeds it; a grid of 1 is legal (the interpreter runs only that: it runs programs one after
another, so a barrier with more than one program would spin forever there).

Barrier: an int32 pair [arrivals, exits]. Arrivals only grow within a launch (barrier i waits for
i x grid); after the last phase each program counts itself out and the last one re-arms both to zero,
so the next launch (a CUDA-graph replay included) starts from zero without a memset.

Numerics follow the per-layer kernels (linear.py, qk_norm_rope_kv.py, attention.py), so `reference`
(the per-layer path with every op as torch) is the oracle.

Status (bench/results/predictor_pass_0.6b_h200.md): correct (bf16 logits cosine >= 0.9999 at 1, 4 and 16
rows over 16 positions; fp32 greedy codes equal to the eager runner's over 200 frames) but not faster, so it
is opt-in (QWEN3TTS_PREDICTOR_PASS=1, engine/kernels) and the engine uses it for at most MAX_ENGINE_ROWS rows.
0.6B on an H200, whole frame: 1 row 3.69 ms against 2.67 per-layer (220 kernels a frame against 539); 4 and
16 rows 9.8 and 10.0 ms against 3.67 and 3.94. A grid barrier's join costs what a launch boundary's does
(bench/results/join_timeline_h200.md), and the phase after it is serial where the per-layer path overlaps
the next weights with the boundary.
"""
from __future__ import annotations

import functools
import math

import torch

from . import emulate_rne, interpreting
from ._util import next_pow2, require, sm_count

# Bound on first use by _kernel() (a jit function finds the helpers it calls among its module's globals).
triton = tl = _round = _rms_apply = _mma = _sync = _prefetch = _gemv = _heads_norm_rope = _token_kv = _put_kv = None
_attend_window = _attend = _k_step = _ld_acquire = _arrive = _wait = None

ENTRIES = 9  # per layer in the address table: qkv, o, gate_up, down, in_norm, post_norm, qk_norm, k, v
MAX_ROWS = 16
MAX_ENGINE_ROWS = 2  # the engine's limit (FusedStack.predictor_pass): 3+ rows measured 2.5x slower, see above


def reference(stack, x, cache, pos, bias, rope, head_weight, fill_only=False):
    """The per-layer torch path: x [B, 1, H] -> logits [B, V] of head_weight (after the final norm), or
    None when fill_only (the caches are written either way)."""
    from ..gpu.fused_layers import NO_KERNELS

    ks, stack.ks = stack.ks, NO_KERNELS
    try:
        h = stack.step(x, cache, pos, bias, rope, final_norm=False)
        return None if fill_only else stack.head(h[:, -1], head_weight)
    finally:
        stack.ks = ks


@functools.cache
def _kernel():
    global triton, tl, _round, _rms_apply, _mma, _sync, _prefetch, _gemv, _heads_norm_rope, _token_kv, _put_kv
    global _attend_window, _attend, _k_step, _ld_acquire, _arrive, _wait
    import triton
    import triton.language as tl

    from . import attention as ka
    from . import linear as kl
    from . import qk_norm_rope_kv as kq

    ka._kernel()  # binds the shared helpers below (same rounding, matmul and attention as the per-layer kernels)
    _round, _rms_apply, _mma = kl._round, kl._rms_apply, kl._mma
    _heads_norm_rope, _token_kv, _put_kv = kq._heads_norm_rope, kq._token_kv, kq._put_kv
    _attend_window = ka._attend_window

    if interpreting():  # one program, so the count is always its own; the interpreter runs no PTX
        @triton.jit
        def _ld_acquire(ptr):
            return tl.load(ptr, volatile=True)
    else:
        @triton.jit
        def _ld_acquire(ptr):
            return tl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                             is_pure=False, pack=1)

    @triton.jit
    def _arrive(bar_ptr):
        """Count this program in (release; its fence waits for the program's memory operations in flight).
        Returns the count before it."""
        tl.debug_barrier()  # every thread's stores of this phase are issued before the count moves
        return tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")

    @triton.jit
    def _wait(bar_ptr, target):
        """Wait for `target` arrivals; returns the count seen. The polls are the acquire: an unused acquire atomic
        adding 0 after relaxed polls was compiled away (Triton 3.6)."""
        seen = _ld_acquire(bar_ptr)
        while seen < target:
            seen = _ld_acquire(bar_ptr)
        return seen

    @triton.jit
    def _sync(bar_ptr, target):
        """Grid barrier."""
        _arrive(bar_ptr)
        _wait(bar_ptr, target)
        tl.debug_barrier()

    @triton.jit
    def _prefetch(w_ptr, pid, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr,
                  ES: tl.constexpr):
        """Ask L2 for this program's weight rows of the next matmul (one prefetch per 128-byte line)."""
        LINES: tl.constexpr = SUB * BN * K * ES // 128
        STEP: tl.constexpr = 128 // ES
        first = pid * SUB * BN * K
        for c in tl.static_range(0, LINES, 256):
            line = c + tl.arange(0, 256)
            off = tl.minimum(first + line * STEP, N * K - STEP)  # the last program's rows end early
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [w_ptr + off],
                                      dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _k_step(acc, x_ptr, sx, w_ptr, rm, m_ok, rn, n_ok, k0, rinv, nw_ptr, K: tl.constexpr,
                PROLOGUE: tl.constexpr, BK: tl.constexpr, dt: tl.constexpr, USE_DOT: tl.constexpr,
                IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """acc += prologue(x[:, k0:k0+BK]) @ W[rn, k0:k0+BK]^T, the prologue's output rounded to dt."""
        rk = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=n_ok[:, None], other=0.0)
        xp = x_ptr + rm[:, None] * sx + rk[None, :]
        if PROLOGUE == 2:
            g = tl.load(xp, mask=m_ok[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
            u = tl.load(xp + K, mask=m_ok[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
            s = _round(g / (1.0 + tl.exp(-g)), dt, EMULATE_RNE).to(tl.float32)
            a = _round(s * u, dt, EMULATE_RNE)
        else:
            a = tl.load(xp, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
            if PROLOGUE == 1:
                a = _rms_apply(a, rinv, nw_ptr, rk, rk < K, dt, EMULATE_RNE)
        return _mma(acc, a, w, USE_DOT, IEEE, False)  # rows on the M side (no swapped product)

    @triton.jit
    def _gemv(x_ptr, sx, w_ptr, y_ptr, sy, res_ptr, sr, nw_ptr, M, eps, pid,
              N: tl.constexpr, K: tl.constexpr, PROLOGUE: tl.constexpr, RESIDUAL: tl.constexpr, SUB: tl.constexpr,
              BLOCK_M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              USE_DOT: tl.constexpr, IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """y[:, this program's SUB x BN columns] = [res +] prologue(x) @ W^T. On the FMA path (1-2 rows)
        every loop is unrolled, so all of the program's weight loads are independent and in flight together
        (one latency, not one per tile); the tensor-core path loops over K at run time. Activations are read
        past L1 (.cg): other programs wrote them in this launch."""
        dt = y_ptr.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        m_ok = rm < M
        rinv = tl.zeros([BLOCK_M], tl.float32)
        if PROLOGUE == 1:
            ss = tl.zeros([BLOCK_M], tl.float32)
            for k0 in tl.static_range(0, K, BK):
                rk = k0 + tl.arange(0, BK)
                xv = tl.load(x_ptr + rm[:, None] * sx + rk[None, :], mask=m_ok[:, None], other=0.0,
                             cache_modifier=".cg").to(tl.float32)
                ss += tl.sum(xv * xv, axis=1)
            rinv = tl.rsqrt(ss / K + eps)
        for sub in tl.static_range(SUB):
            rn = (pid * SUB + sub) * BN + tl.arange(0, BN)
            n_ok = rn < N
            acc = tl.zeros([BLOCK_M, BN], tl.float32)
            if USE_DOT:
                # A loop at run time: unrolled, the 16-row pass compiled (Triton 3.6, sm_90) to 44.3K
                # instructions and spilled 2.3 KB a thread; looped, 9.3K and none.
                for k0 in tl.range(0, K, BK):
                    acc = _k_step(acc, x_ptr, sx, w_ptr, rm, m_ok, rn, n_ok, k0, rinv, nw_ptr, K, PROLOGUE, BK, dt,
                                  USE_DOT, IEEE, EMULATE_RNE)
            else:
                for k0 in tl.static_range(0, K, BK):
                    acc = _k_step(acc, x_ptr, sx, w_ptr, rm, m_ok, rn, n_ok, k0, rinv, nw_ptr, K, PROLOGUE, BK, dt,
                                  USE_DOT, IEEE, EMULATE_RNE)
            out_ok = m_ok[:, None] & n_ok[None, :]
            if RESIDUAL:
                acc += tl.load(res_ptr + rm[:, None] * sr + rn[None, :], mask=out_ok, other=0.0,
                               cache_modifier=".cg").to(tl.float32)
            tl.store(y_ptr + rm[:, None] * sy + rn[None, :], _round(acc, dt, EMULATE_RNE), mask=out_ok)

    @triton.jit
    def _attend(qkv_ptr, att_ptr, kc_ptr, vc_ptr, qkn_ptr, cos_ptr, sin_ptr, bias_ptr, pos, M, eps, scale,
                pid, grid, NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, S: tl.constexpr,
                GP: tl.constexpr, EMULATE_RNE: tl.constexpr):
        """One tile per (row, kv head): its k/v at `pos` into the cache, then its query heads attend over
        all S cache positions (the bias masks the future)."""
        dt = att_ptr.dtype.element_ty
        GQ: tl.constexpr = NH // NKV
        QKV: tl.constexpr = (NH + 2 * NKV) * D
        cols = tl.arange(0, D)
        rot = (cols + D // 2) % D
        c = tl.load(cos_ptr + cols).to(tl.float32)
        s = tl.load(sin_ptr + cols).to(tl.float32)
        gi = tl.arange(0, GP)
        n = tl.arange(0, S)
        bias = tl.load(bias_ptr + n).to(tl.float32)
        for t in range(pid, M * NKV, grid):
            b = t // NKV
            h = t % NKV
            row = qkv_ptr + b * QKV
            cache = b * (NKV * S * D) + h * (S * D)
            k, v, live = _token_kv(row, qkn_ptr, h, cols, rot, c, s, eps, NH, NKV, D, dt, EMULATE_RNE)
            _put_kv(kc_ptr + cache + pos * D, vc_ptr + cache + pos * D, k, v, live, cols)
            qh = h * GQ + gi
            q_ok = gi < GQ
            q = _heads_norm_rope(row, qkn_ptr, qh, q_ok, cols, rot, c, s, eps, D, dt, EMULATE_RNE).to(tl.float32)
            tl.debug_barrier()  # this program's cache writes are visible to all its threads
            kk = tl.load(kc_ptr + cache + n[:, None] * D + cols[None, :], cache_modifier=".cg").to(tl.float32)
            vv = tl.load(vc_ptr + cache + n[:, None] * D + cols[None, :], cache_modifier=".cg").to(tl.float32)
            out = _attend_window(q, kk, vv, bias, scale, dt, EMULATE_RNE)
            tl.store(att_ptr + b * (NH * D) + qh[:, None] * D + cols[None, :], _round(out, dt, EMULATE_RNE),
                     mask=q_ok[:, None])

    @triton.jit
    def predictor_pass_kernel(
            x_ptr, out_ptr, base_ptr, tab_ptr, head_ptr, fnorm_ptr, cos_ptr, sin_ptr, bias_ptr, pos_ptr,
            xa_ptr, mid_ptr, qkv_ptr, att_ptr, gu_ptr, bar_ptr, M, fill_only, eps, qk_eps, scale,
            H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, INTER: tl.constexpr,
            V: tl.constexpr, S: tl.constexpr, L: tl.constexpr, GP: tl.constexpr,
            BLOCK_M: tl.constexpr, BN_W: tl.constexpr, BK_W: tl.constexpr, BN_N: tl.constexpr,
            BK_N: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr, EMULATE_RNE: tl.constexpr,
            PREFETCH: tl.constexpr, ES: tl.constexpr, SUB_QKV: tl.constexpr, SUB_O: tl.constexpr,
            SUB_GU: tl.constexpr, SUB_D: tl.constexpr, SUB_HEAD: tl.constexpr):
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        QKV: tl.constexpr = (NH + 2 * NKV) * D
        A: tl.constexpr = NH * D
        pos = tl.load(pos_ptr)
        src = x_ptr  # the layer's input: the caller's x, then the running hidden state xa
        k = 0  # barriers passed
        for layer in range(L):
            tab = tab_ptr + layer * 9
            w_qkv = base_ptr + tl.multiple_of(tl.load(tab + 0), 8)
            w_o = base_ptr + tl.multiple_of(tl.load(tab + 1), 8)
            w_gu = base_ptr + tl.multiple_of(tl.load(tab + 2), 8)
            w_d = base_ptr + tl.multiple_of(tl.load(tab + 3), 8)
            n_in = base_ptr + tl.load(tab + 4)
            n_post = base_ptr + tl.load(tab + 5)
            n_qk = base_ptr + tl.load(tab + 6)
            kc = base_ptr + tl.multiple_of(tl.load(tab + 7), 8)
            vc = base_ptr + tl.multiple_of(tl.load(tab + 8), 8)
            _gemv(src, H, w_qkv, qkv_ptr, QKV, src, H, n_in, M, eps, pid, QKV, H, 1, False, SUB_QKV,
                  BLOCK_M, BN_W, BK_W, USE_DOT, IEEE, EMULATE_RNE)
            k += 1
            _sync(bar_ptr, k * grid)
            _attend(qkv_ptr, att_ptr, kc, vc, n_qk, cos_ptr, sin_ptr, bias_ptr, pos, M, qk_eps, scale, pid, grid,
                    NH, NKV, D, S, GP, EMULATE_RNE)
            if PREFETCH:
                _prefetch(w_o, pid, H, A, BN_N, SUB_O, ES)
            k += 1
            _sync(bar_ptr, k * grid)
            if fill_only == 0 or layer < L - 1:  # a cache-filling pass stops after the last cache write
                _gemv(att_ptr, A, w_o, mid_ptr, H, src, H, n_in, M, eps, pid, H, A, 0, True, SUB_O,
                      BLOCK_M, BN_N, BK_N, USE_DOT, IEEE, EMULATE_RNE)
                if PREFETCH:
                    _prefetch(w_gu, pid, 2 * INTER, H, BN_W, SUB_GU, ES)
                k += 1
                _sync(bar_ptr, k * grid)
                _gemv(mid_ptr, H, w_gu, gu_ptr, 2 * INTER, mid_ptr, H, n_post, M, eps, pid, 2 * INTER, H, 1,
                      False, SUB_GU, BLOCK_M, BN_W, BK_W, USE_DOT, IEEE, EMULATE_RNE)
                if PREFETCH:
                    _prefetch(w_d, pid, H, INTER, BN_N, SUB_D, ES)
                k += 1
                _sync(bar_ptr, k * grid)
                _gemv(gu_ptr, 2 * INTER, w_d, xa_ptr, H, mid_ptr, H, n_in, M, eps, pid, H, INTER, 2, True, SUB_D,
                      BLOCK_M, BN_N, BK_N, USE_DOT, IEEE, EMULATE_RNE)
                if PREFETCH:
                    if layer + 1 < L:
                        _prefetch(base_ptr + tl.multiple_of(tl.load(tab + 9), 8), pid, QKV, H, BN_W, SUB_QKV, ES)
                    else:
                        _prefetch(head_ptr, pid, V, H, BN_W, SUB_HEAD, ES)
                k += 1
                _sync(bar_ptr, k * grid)
                src = xa_ptr
        if fill_only == 0:
            _gemv(xa_ptr, H, head_ptr, out_ptr, V, xa_ptr, H, fnorm_ptr, M, eps, pid, V, H, 1, False, SUB_HEAD,
                  BLOCK_M, BN_W, BK_W, USE_DOT, IEEE, EMULATE_RNE)
        # Count out; the last program out re-arms the barrier (everyone has passed every wait by then).
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)

    return predictor_pass_kernel


def _largest_pow2_dividing(n: int, at_most: int) -> int:
    b = 1
    while b * 2 <= at_most and n % (b * 2) == 0:
        b *= 2
    return b


def tiles(m: int, hidden: int, wide_n: int, narrow_k: int) -> dict:
    """Tile shapes (pure Python): up to 2 rows FMAs over [rows, BN, BK] (16384-element tiles), above that
    tensor cores with rows padded to 16. Wide phases (qkv, gate/up, head) and narrow ones (o, down: N =
    hidden) get their own BN so both spread over ~128 programs."""
    use_dot = m > 2
    bn_w, bn_n = (16, 16) if use_dot else (16, 8)
    bn_n = min(bn_n, _largest_pow2_dividing(hidden, bn_n))
    bn_w = min(bn_w, _largest_pow2_dividing(wide_n, bn_w))
    bk_w = _largest_pow2_dividing(hidden, 256 if use_dot else 16384 // bn_w)
    bk_n = _largest_pow2_dividing(narrow_k, 256 if use_dot else 16384 // bn_n)
    return {"BLOCK_M": max(16, next_pow2(m)) if use_dot else next_pow2(m), "USE_DOT": use_dot,
            "BN_W": bn_w, "BN_N": bn_n, "BK_W": bk_w, "BK_N": bk_n}


class PredictorPass:
    """Launcher of one FusedStack's persistent pass (its address tables, workspaces and barrier)."""

    def __init__(self, stack, grid: int | None = None, prefetch: bool | None = None, num_warps: int = 8,
                 max_rows: int = MAX_ENGINE_ROWS):
        layers = stack.layers
        f0 = layers[0]
        self.stack = stack
        self.nh, self.nkv, self.d = f0.nh, f0.nkv, f0.d
        self.hidden = f0.layer.input_layernorm.weight.shape[0]
        self.inter = f0.gate_up.shape[0] // 2
        self.eps, self.qk_eps, self.scale = f0.eps, f0.qk_eps, f0.scale
        self.base = f0.qkv
        self.dtype, self.device = self.base.dtype, self.base.device
        self.grid_override = grid
        self.prefetch = (not interpreting()) if prefetch is None else prefetch
        self.num_warps = num_warps
        self.max_rows = max_rows  # rows FusedStack.predictor_pass sends here (more run per layer)
        self.tables: dict = {}
        self.work: dict = {}
        self.grids: dict = {}
        self.barrier = torch.zeros(2, dtype=torch.int32, device=self.device)

    def _offset(self, t: torch.Tensor, aligned=True) -> int:
        require(t.dtype == self.dtype and t.is_contiguous(), "weights and caches in one dtype, contiguous")
        diff = t.data_ptr() - self.base.data_ptr()
        es = self.base.element_size()
        require(diff % es == 0 and (not aligned or diff % (8 * es) == 0), "16-byte aligned weights and caches")
        return diff // es

    def _table(self, cache) -> torch.Tensor:
        key = tuple(t.data_ptr() for t in cache.k + cache.v)
        if key not in self.tables:
            rows = []
            for i, f in enumerate(self.stack.layers):
                lay = f.layer
                rows.append([self._offset(f.qkv), self._offset(lay.self_attn.o_proj.weight),
                             self._offset(f.gate_up), self._offset(lay.mlp.down_proj.weight),
                             self._offset(lay.input_layernorm.weight, False),
                             self._offset(lay.post_attention_layernorm.weight, False),
                             self._offset(f.qk_norm, False), self._offset(cache.k[i]), self._offset(cache.v[i])])
            rows.append([rows[0][0]] + [0] * (ENTRIES - 1))  # the prefetch of "layer L" reads entry 0
            # Kept with the cache it addresses: a graph captured on these addresses needs them alive.
            self.tables[key] = (torch.tensor(rows, dtype=torch.int64, device=self.device), cache)
        return self.tables[key][0]

    def _workspace(self, m: int) -> list:
        if m not in self.work:
            def buf(n):
                return torch.empty(m, n, dtype=self.dtype, device=self.device)
            qkv_n = (self.nh + 2 * self.nkv) * self.d
            self.work[m] = [buf(self.hidden), buf(self.hidden), buf(qkv_n), buf(self.nh * self.d), buf(2 * self.inter)]
        return self.work[m]

    def __call__(self, x, cache, pos, bias, rope, head_weight, fill_only=False):
        """Same contract as `reference`. fill_only: a pass whose output nobody reads (the frame's position
        0): it skips the last layer's work after its cache write and the head, and returns None. The head
        weight is passed either way, so both kinds of pass run one compiled kernel."""
        b = x.shape[0]
        x2 = x.reshape(b, -1)
        require(1 <= b <= MAX_ROWS and x2.shape[1] == self.hidden and x2.is_contiguous(),
                f"1..{MAX_ROWS} contiguous rows of the hidden width")
        cos, sin_signed = (t.reshape(-1, self.d) for t in rope)
        require(cos.shape[0] == 1 and pos.numel() == 1 and bias.numel() == cache.max_len,
                "one position for every row, bias over the whole cache window")
        require(cache.max_len == next_pow2(cache.max_len), "power-of-two predictor cache")
        require(head_weight.is_contiguous() and head_weight.dtype == self.dtype, "a contiguous head weight")
        vocab = head_weight.shape[0]
        wide = (self.nh + 2 * self.nkv) * self.d
        # One BK for o_proj and down_proj: it must divide both K (their gcd).
        t = tiles(b, self.hidden, math.gcd(wide, 2 * self.inter, vocab), math.gcd(self.nh * self.d, self.inter))
        require(t["USE_DOT"] is False or min(t["BN_W"], t["BN_N"], t["BK_W"], t["BK_N"]) >= 16,
                "tensor-core tiles of at least 16")
        xa, mid, qkv, att, gu = self._workspace(b)
        out = torch.empty(b, vocab, dtype=self.dtype, device=self.device)
        norm = self.stack.stack.norm
        args = (x2, out, self.base, self._table(cache), head_weight, norm.weight,
                cos.contiguous(), sin_signed.contiguous(), bias.reshape(-1), pos.reshape(-1), xa, mid, qkv, att,
                gu, self.barrier, b, int(bool(fill_only)), float(self.eps), float(self.qk_eps), float(self.scale))
        meta = dict(H=self.hidden, NH=self.nh, NKV=self.nkv, D=self.d, INTER=self.inter, V=vocab,
                    S=cache.max_len, L=len(self.stack.layers), GP=max(2, next_pow2(self.nh // self.nkv)),
                    IEEE=self.dtype == torch.float32 or interpreting(),
                    EMULATE_RNE=emulate_rne(self.dtype), PREFETCH=self.prefetch,
                    ES=self.base.element_size(), num_warps=self.num_warps, **t)
        grid = self.grid(args, meta, {"SUB_QKV": wide, "SUB_O": self.hidden, "SUB_GU": 2 * self.inter,
                                      "SUB_D": self.hidden, "SUB_HEAD": vocab})
        _kernel()[(grid,)](*args, **meta)
        return None if fill_only else out

    def grid(self, args, meta, widths) -> int:
        """Programs for this launch, never more than can be resident at once (see the module doc); sets
        each phase's SUB (column tiles per program) in `meta`. The grid is one program per SM: the
        weights stream at HBM speed either way, and fewer programs make cheaper barriers."""
        if self.grid_override is not None or interpreting():
            grid = self.grid_override or 1
        else:
            grid = sm_count(self.device)
        for name, n in widths.items():
            bn = meta["BN_N"] if name in ("SUB_O", "SUB_D") else meta["BN_W"]
            meta[name] = -(-(n // bn) // grid)
        if not interpreting():
            key = tuple(sorted(meta.items()))
            if key not in self.grids:
                compiled = _kernel().warmup(*args, grid=(grid,), **meta)
                compiled._init_handles()  # loads the binary: n_regs is known from here
                self.grids[key] = resident_programs(compiled, self.device, meta["num_warps"])
            if self.grids[key] < grid:
                raise NotResidentError(f"{grid} programs but only {self.grids[key]} can be resident at once")
        return grid


class NotResidentError(RuntimeError):
    """The persistent pass cannot keep all its programs resident on this device."""


def resident_programs(compiled, device, num_warps: int, per_sm: int = 1) -> int:
    """SM count x min(per_sm, programs one SM can hold given the kernel's threads, registers and shared
    memory). Raises NotResidentError when not even one fits."""
    props = torch.cuda.get_device_properties(device)
    threads = 32 * num_warps
    regs = max(1, getattr(compiled, "n_regs", 0) or 0)
    shared = (getattr(compiled, "metadata", None) and getattr(compiled.metadata, "shared", 0)) or 0
    fits = [getattr(props, "max_threads_per_multi_processor", 2048) // threads,
            getattr(props, "regs_per_multiprocessor", 65536) // (regs * threads)]
    if shared:
        fits.append(getattr(props, "shared_memory_per_multiprocessor", 228 * 1024) // shared)
    per_sm = min(per_sm, *fits)
    if per_sm < 1:
        raise NotResidentError(f"one program needs {regs} registers x {threads} threads and {shared} B of shared "
                               f"memory: it does not fit an SM of {props.name}")
    return props.multi_processor_count * per_sm
