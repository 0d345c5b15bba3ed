"""What one dependent GEMV phase costs, by the way phases are joined (issue 14: can a persistent pass beat
the per-layer launches?).

    python bench/phase_cost.py [--phases 21] [--warps 8 16] [--k 2048] [--modes ...] [--out F.json]

A synthetic chain shaped like a code-predictor pass: PHASES GEMVs, each y = W_p x over its own [N, K] bf16
weight (N = K = 2048, 8 MB; all phases together are past L2, so every phase streams from HBM), each phase's x
the first K of the previous phase's N outputs (--k 1024: 4 MB phases). Programs: 128, each owns 16 rows of
every W_p (64 KB a phase at K = 2048), as the persistent pass does. Ways of joining the phases:

  launches      one launch a phase, captured in a CUDA graph, plain launches;
  launches_pdl  the same with programmatic dependent launch, weights loaded before the wait (the per-layer
                path today: engine/kernels/pdl.py);
  after         one persistent launch, a grid barrier between phases, each phase's weights loaded after
                its barrier (the opt-in predictor_pass with its L2 prefetch off);
  before        one persistent launch, each phase's weights loaded into registers *before* the barrier that
                precedes it, so HBM streams while the grid waits;
  late          as before, but the loads are issued just after the program's arrival: the release atomic's fence
                waits for the thread's memory operations in flight, loads included (bench/join_timeline.py);
  no_barrier    one launch, no barrier (wrong results: the floor of streaming the weights in one launch);
  barrier_only  one launch, barriers and the activation reads, no weight loads (the barrier's own cost);
  *_flag        after / before / barrier_only with another barrier: the arrivals count on one 128-byte line,
                the last arrival raises a flag on another, and the programs wait on the flag with acquire
                loads (predictor_pass._sync polls, with acquire loads, the counter the arrivals hit: every
                program's atomics and polls share one line).
  smem1, smem2  one persistent launch written in Gluon: each program copies its weight tiles into shared
                memory with cp.async, STAGES phases ahead (1: the next phase's tile flies while the grid
                waits, 2: the next two), so HBM streams while the grid waits and no registers are held
                across the barrier. The barrier is split: a program counts itself in after its store, asks
                for the next tile, and waits for the count just before it reads x. (So the copy asked for in
                a phase is never in flight at that phase's release; asking first measured 0.1 µs slower.)
  smem_free     smem2 without the wait (wrong results): the floor of streaming through cp.async.
  smem_resident smem2's barrier chain over one tile loaded once (every phase multiplies by W_0; no stream):
                the cost of the chain itself (barrier, x from L2, the tile from shared memory, the sum).
                These two tell which of the two limits bounds smem2's time.
  tagged1, tagged2
                as smem1 / smem2, but no barrier and no atomics between phases: every activation is stored as
                32-bit words, the bf16 value in the low half and the phase's tag in the high half, and a
                program polls the whole of its x until every word carries the tag it waits for (one aligned
                word is written and read whole, so a value is never seen without its tag). Nothing then waits
                on a release fence, and the wait is one store-to-load trip through L2. Tags are launch epoch x
                PHASES + phase (mod 2^16), the epoch bumped by the last program out, so a replay never reads
                the previous replay's words as fresh.
  tma1, tma2    as smem1 / smem2 with the Hopper tensor-memory accelerator: one thread asks for the program's tile as
                K/256 bulk copies of 16 x 256, an mbarrier a slot says when they have landed; the copies do not
                go through the threads' load queues, which the grid barrier's polls and the x reads use.

  ws2, ws3      warp-specialized: one loader warp streams the program's tiles by bulk tensor copies into 2 / 3
                shared-memory slots (an mbarrier pair a slot: landed, free), as far ahead as the slots allow and
                never held up by the grid barrier; the default warps wait for the count, read x, multiply the
                landed tile, free its slot, store and count themselves in. Neither the arrival's fence nor the
                polls sit behind the weight stream in their warps (bench/join_timeline.py: a fence waits for its
                warp's loads in flight, 3.4 us a phase when the next weights were asked before the arrival).

  alternate     one Triton launch of two programs an SM in two groups that take the phases in turn: a group asks
                for its next phase's weights (into registers) just after its arrival, and they stream in while the
                other group waits for the count and computes. PDL's overlap (the next kernel's programs load while
                this one runs) inside one launch; alternate_mixed pairs the groups by launch order instead.
                Two programs an SM need <= 128 registers a thread at 8 warps (Triton takes 183): 4 warps only.
  *_one         after / late / barrier_only / alternate with the count polled by each program's thread 0 alone, the
                other threads held at the program's barrier (a cooperative grid sync's shape), not by every warp.
  alternate_smem  the same in Gluon with each program's tile in shared memory (cp.async), so 8 warps fit.
  tag_regs      one Triton launch, joined by tags as tagged1/2 but with no shared memory: each phase's weights
                load into registers right after the previous phase's products (no fence can wait for them, since
                nothing is released), each thread spins on one word of one producer's rows, then the program reads
                its whole x and checks every tag.

The Gluon ways (smem, tagged, tma, ws) are written against Triton 3.6's Gluon, the GPU image's; Gluon is
experimental and its API moved in later releases (the venv's Triton 3.9 rejects these kernels).

Every way that joins phases correctly is checked against `launches` (same final activations).

Per phase = (time of PHASES phases - time of 1 phase) / (PHASES - 1), so the launch and the first ramp
cancel out (the Gluon ways: of 2 phases, / (PHASES - 2); "us for 1 phase" is then the 2-phase chain's).
GPU time of a CUDA-graph replay (events), best of 5 means of 20 replays.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, mean_gpu_ms

N = K = 2048
BN = 16
GRID = N // BN
_arrive = _wait = _enter = _flag_sync = _ld_acquire = _stamp = _stamp_word = None  # bound by kernels(): a jit
# function finds its helpers among its module's globals
gl = None  # bound by gluon_kernels(): a warp-specialized partition reads its annotations there
MODES = ("launches", "launches_pdl", "after", "before", "late", "no_barrier", "barrier_only", "after_flag",
         "before_flag", "barrier_only_flag", "smem1", "smem2", "smem_free", "smem_resident", "tagged1", "tagged2",
         "tma1", "tma2", "ws2", "ws3", "tag_regs", "alternate", "alternate_mixed",
         "alternate_smem", "alternate_one", "after_one", "late_one", "barrier_only_one")
BK_TMA = 256  # the widest box a bulk tensor copy takes in one dimension
# ways whose activations are not the chain's (not checked against it)
WRONG = ("no_barrier", "barrier_only", "barrier_only_flag", "barrier_only_one", "smem_free", "smem_resident")
WAY = {"after": 0, "before": 1, "no_barrier": 2, "barrier_only": 3, "late": 4}
FLAG_AT = 32  # int32 slots: the flag sits on its own 128-byte line
STAMP_SLOTS = 4  # int64 stamps a program and phase (join_timeline.py): x arrived, y stored, counted in, seen


@functools.cache
def kernels():
    """(chained, one_phase, chained_tags, alternating). chained and one_phase take `t_ptr` and, with STAMPS, write
    each program's %globaltimer stamps there (bench/join_timeline.py); without, they compile as if it were absent."""
    global _arrive, _wait, _enter, _flag_sync, _ld_acquire, _stamp, _stamp_word
    import triton
    import triton.language as tl

    from engine.kernels import pdl, predictor_pass

    predictor_pass._kernel()
    _arrive, _wait, _ld_acquire = predictor_pass._arrive, predictor_pass._wait, predictor_pass._ld_acquire
    _enter = pdl.enter()

    @triton.jit
    def _stamp(dep):
        # the timer read is predicated on a test of dep, so it waits for dep's value
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.eq.s32 p, $1, 2147483647; @p mov.u64 $0, 0; @!p mov.u64 $0, %globaltimer; }",
            "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def _stamp_word(ptr):
        """A stamp taken once one bf16 word, read after the vector read that holds it, has arrived."""
        return _stamp(tl.load(ptr, cache_modifier=".cg").to(tl.int16, bitcast=True).to(tl.int32))

    @triton.jit
    def _wait_one(bar_ptr, target):
        """_wait polled by the program's thread 0 alone (the others wait at the barrier after it), as a cooperative
        grid sync does: one poller a program instead of every warp on the count's line. Returns the count it saw
        (0 in the other threads)."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; mov.u32 $0, 0; setp.ne.u32 p, t, 0; @p bra DONE${:uid}; "
            "SPIN${:uid}: ld.acquire.gpu.global.u32 $0, [$1]; setp.lt.s32 p, $0, $2; @p bra SPIN${:uid}; "
            "DONE${:uid}: }", "=r,l,r", [bar_ptr, target], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _wait_for(bar_ptr, target, ONE):
        """The count's wait: every thread polls (predictor_pass._wait), or with ONE (a constexpr) thread 0 alone
        (_wait_one)."""
        if ONE:
            return _wait_one(bar_ptr, target)
        return _wait(bar_ptr, target)

    @triton.jit
    def _flag_sync(bar_ptr, phase, grid, FLAG_AT: tl.constexpr):
        tl.debug_barrier()  # the program's stores of this phase are issued before it counts itself in
        arrived = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == phase * grid - 1:
            tl.atomic_xchg(bar_ptr + FLAG_AT, phase, sem="release", scope="gpu")
        seen = _ld_acquire(bar_ptr + FLAG_AT)
        while seen < phase:
            seen = _ld_acquire(bar_ptr + FLAG_AT)
        tl.debug_barrier()

    @triton.jit
    def chained(w_ptr, act_ptr, bar_ptr, t_ptr, PHASES: tl.constexpr, WAY: tl.constexpr, N: tl.constexpr,
                K: tl.constexpr, BN: tl.constexpr, FLAG: tl.constexpr, FLAG_AT: tl.constexpr,
                STAMPS: tl.constexpr, ONE: tl.constexpr = False):
        tl.static_assert(not STAMPS or (WAY != 2 and not FLAG), "stamps are taken at the count barrier only")
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        tile = rn[:, None] * K + rk[None, :]
        w = tl.zeros([BN, K], tl.bfloat16)
        if WAY == 1 or WAY == 2 or WAY == 4:
            w = tl.load(w_ptr + tile)
        for p in range(PHASES):
            if WAY == 0:
                w = tl.load(w_ptr + p * N * K + tile)
            x = tl.load(act_ptr + p * N + rk, cache_modifier=".cg").to(tl.float32)
            if STAMPS:
                t_x = _stamp_word(act_ptr + p * N)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(act_ptr + (p + 1) * N + rn, y.to(tl.bfloat16))
            if STAMPS:
                t_d = _stamp(pid)
            if WAY == 1 or WAY == 2:
                if p + 1 < PHASES:
                    w = tl.load(w_ptr + (p + 1) * N * K + tile)
            if WAY != 2:
                if FLAG:
                    _flag_sync(bar_ptr, p + 1, grid, FLAG_AT)
                else:  # predictor_pass._sync, taken apart for the late loads and the stamps
                    arrived = _arrive(bar_ptr)
                    if STAMPS:
                        t_a = _stamp(arrived)
                    if WAY == 4:  # after the release, so its fence cannot wait for these loads
                        if p + 1 < PHASES:
                            w = tl.load(w_ptr + (p + 1) * N * K + tile)
                    seen = _wait_for(bar_ptr, (p + 1) * grid, ONE)
                    if STAMPS:
                        t_s = _stamp(seen)
                    tl.debug_barrier()
                    if STAMPS:
                        at = t_ptr + (p * grid + pid) * 4  # STAMP_SLOTS
                        tl.store(at, t_x)
                        tl.store(at + 1, t_d)
                        tl.store(at + 2, t_a)
                        tl.store(at + 3, t_s)
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)
            if FLAG:
                tl.atomic_xchg(bar_ptr + FLAG_AT, 0)

    @triton.jit
    def _spin(ptr, want):
        # each thread re-reads its word until the word's high half carries the tag `want`
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; SPIN${:uid}: ld.volatile.global.u32 $0, [$1]; shr.u32 t, $0, 16; "
            "setp.ne.u32 p, t, $2; @p bra SPIN${:uid}; }", "=r,l,r", [ptr, want], dtype=tl.int32,
            is_pure=False, pack=1)

    @triton.jit
    def chained_tags(w_ptr, act_ptr, state_ptr, PHASES: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                     BN: tl.constexpr, PRODUCERS: tl.constexpr):
        """Phases joined by tags in the activations' words (bf16 bits low, phase tag high): no barrier, no fence,
        so each phase's weights load into registers while the program waits for its x. state_ptr: [exits, epoch]."""
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        tile = rn[:, None] * K + rk[None, :]
        first = tl.load(state_ptr + 1, volatile=True) * PHASES  # this launch's epoch
        heads = tl.arange(0, PRODUCERS) * BN  # one word of every producer's rows: one poll a thread
        w = tl.load(w_ptr + tile)
        words = tl.load(act_ptr + rk)  # the input carries no tag
        for p in range(PHASES):
            if p > 0:
                want = (first + p) & 0xFFFF
                _spin(act_ptr + p * N + heads, want)
                tl.debug_barrier()
                words = tl.load(act_ptr + p * N + rk, volatile=True)
                stale = tl.max((((words >> 16) & 0xFFFF) != want).to(tl.int32), axis=0)
                while stale != 0:  # a producer's other words may land after its polled one
                    words = tl.load(act_ptr + p * N + rk, volatile=True)
                    stale = tl.max((((words >> 16) & 0xFFFF) != want).to(tl.int32), axis=0)
            x = (words << 16).to(tl.float32, bitcast=True)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            if p + 1 < PHASES:
                w = tl.load(w_ptr + (p + 1) * N * K + tile)
            bits = y.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            tl.store(act_ptr + (p + 1) * N + rn, bits | (((first + p + 1) & 0xFFFF) << 16))
        done = tl.atomic_add(state_ptr, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            tl.atomic_xchg(state_ptr, 0)
            tl.atomic_add(state_ptr + 1, 1)

    @triton.jit
    def one_phase(w_ptr, act_ptr, t_ptr, p, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr,
                  STAMPS: tl.constexpr):
        pid = tl.program_id(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        w = tl.load(w_ptr + p * N * K + rn[:, None] * K + rk[None, :])  # weights: before the wait
        _enter(PDL)
        x = tl.load(act_ptr + p * N + rk).to(tl.float32)
        if STAMPS:
            t_x = _stamp_word(act_ptr + p * N)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        tl.store(act_ptr + (p + 1) * N + rn, y.to(tl.bfloat16))
        if STAMPS:
            at = t_ptr + (p * tl.num_programs(0) + pid) * 4  # STAMP_SLOTS
            tl.store(at, t_x)
            tl.store(at + 1, _stamp(pid))

    @triton.jit
    def alternating(w_ptr, act_ptr, bar_ptr, PHASES: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                    BN: tl.constexpr, MIXED: tl.constexpr, ONE: tl.constexpr):
        """Two groups of programs take the phases in turn (group g: phases g, g + 2, ...), two programs an SM.
        A group asks for its next tile just after its arrival and has the other group's whole phase to receive it,
        as PDL's next kernel loads its weights while the previous one runs: no program waits at a fence or a poll
        behind its next phase's loads while that phase is the one being joined."""
        pid = tl.program_id(0)
        half = tl.num_programs(0) // 2
        if MIXED:  # neighbours in launch order in different groups
            g = pid % 2
            r = pid // 2
        else:
            g = pid // half
            r = pid % half
        rn = r * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        tile = rn[:, None] * K + rk[None, :]
        w = tl.load(w_ptr + g * N * K + tile, mask=g < PHASES, other=0.0)
        for p in range(g, PHASES, 2):
            if p > 0:
                _wait_for(bar_ptr, p * half, ONE)
                tl.debug_barrier()
            x = tl.load(act_ptr + p * N + rk, cache_modifier=".cg").to(tl.float32)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(act_ptr + (p + 1) * N + rn, y.to(tl.bfloat16))
            _arrive(bar_ptr)
            w = tl.load(w_ptr + (p + 2) * N * K + tile, mask=p + 2 < PHASES, other=0.0)
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == 2 * half - 1:
            tl.atomic_xchg(bar_ptr, 0)
            tl.atomic_xchg(bar_ptr + 1, 0)

    return chained, one_phase, chained_tags, alternating


@functools.cache
def gluon_kernels():
    """The Gluon ways' kernels: chained_smem (smem*, tagged*), chained_tma (tma*), chained_ws (ws*) and
    alternating_smem (alternate_smem)."""
    global gl
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    @gluon.jit
    def ld_acquire(ptr):
        return gl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def chained_smem(w_ptr, act_ptr, bar_ptr, PHASES: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                     BN: gl.constexpr, STAGES: gl.constexpr, WAIT: gl.constexpr, STREAM: gl.constexpr,
                     TAGS: gl.constexpr):
        """Weights by cp.async groups into shared memory. Phases joined by the arrivals count (bar_ptr:
        [arrivals, exits]) or, with TAGS, by tags in act_ptr's int32 words (bar_ptr: [exits, epoch])."""
        WARPS: gl.constexpr = gl.num_warps()
        L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
        S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        pid = gl.program_id(0)
        grid = gl.num_programs(0)
        rn = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
        rk = gl.arange(0, K, layout=gl.SliceLayout(0, L))
        tile = gl.expand_dims(rn, 1) * K + gl.expand_dims(rk, 0)
        first_tag = 0
        if TAGS:
            first_tag = gl.load(bar_ptr + 1, volatile=True) * PHASES  # this launch's epoch
        buf = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, K], S)
        for s in gl.static_range(STAGES):
            if s < PHASES and (STREAM or s == 0):
                cp.async_copy_global_to_shared(buf.index(s), w_ptr + s * N * K + tile)
            cp.commit_group()
        for p in range(PHASES):
            if TAGS:
                words = gl.load(act_ptr + p * N + rk, volatile=True)
                if p > 0:
                    want = (first_tag + p) & 0xFFFF
                    stale = gl.max((((words >> 16) & 0xFFFF) != want).to(gl.int32), axis=0)
                    while stale != 0:
                        words = gl.load(act_ptr + p * N + rk, volatile=True)
                        stale = gl.max((((words >> 16) & 0xFFFF) != want).to(gl.int32), axis=0)
                x = (words << 16).to(gl.float32, bitcast=True)  # the low half is the bf16's bits
            elif WAIT and p > 0:
                seen = ld_acquire(bar_ptr)
                while seen < p * grid:
                    seen = ld_acquire(bar_ptr)
            cp.wait_group(STAGES - 1)  # phase p's group; the STAGES - 1 after it may still fly
            gl.thread_barrier()
            if STREAM:
                w = buf.index(p % STAGES).load(L)
            else:
                w = buf.index(0).load(L)
            if not TAGS:
                x = gl.load(act_ptr + p * N + rk, cache_modifier=".cg").to(gl.float32)
            y = gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=1)
            if TAGS:
                bits = y.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
                gl.store(act_ptr + (p + 1) * N + rn, bits | (((first_tag + p + 1) & 0xFFFF) << 16))
                gl.thread_barrier()  # every thread's reads of the slot are done
            else:
                gl.store(act_ptr + (p + 1) * N + rn, y.to(gl.bfloat16))
                gl.thread_barrier()  # every thread's store is issued, and its reads of the slot done
                gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
            if STREAM and p + STAGES < PHASES:  # after the release, which this copy can then never hold up
                cp.async_copy_global_to_shared(buf.index(p % STAGES), w_ptr + (p + STAGES) * N * K + tile)
            cp.commit_group()  # one group a phase, empty at the end, so wait_group counts phases
        if TAGS:
            done = gl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
            if done == grid - 1:
                gl.atomic_xchg(bar_ptr, 0)
                gl.atomic_add(bar_ptr + 1, 1)
        else:
            done = gl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
            if done == grid - 1:
                gl.atomic_xchg(bar_ptr, 0)
                gl.atomic_xchg(bar_ptr + 1, 0)

    @gluon.jit
    def alternating_smem(w_ptr, act_ptr, bar_ptr, PHASES: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                         BN: gl.constexpr):
        """`alternating` with each program's tile in shared memory (cp.async): two groups take the phases in
        turn, a group asks for its next tile just after its arrival and it lands while the other group computes."""
        WARPS: gl.constexpr = gl.num_warps()
        L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
        S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        pid = gl.program_id(0)
        half = gl.num_programs(0) // 2
        g = pid // half
        rn = (pid % half) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
        rk = gl.arange(0, K, layout=gl.SliceLayout(0, L))
        tile = gl.expand_dims(rn, 1) * K + gl.expand_dims(rk, 0)
        buf = gl.allocate_shared_memory(gl.bfloat16, [BN, K], S)
        if g < PHASES:
            cp.async_copy_global_to_shared(buf, w_ptr + g * N * K + tile)
        cp.commit_group()
        for p in range(g, PHASES, 2):
            if p > 0:
                seen = ld_acquire(bar_ptr)
                while seen < p * half:
                    seen = ld_acquire(bar_ptr)
            cp.wait_group(0)
            gl.thread_barrier()
            w = buf.load(L)
            x = gl.load(act_ptr + p * N + rk, cache_modifier=".cg").to(gl.float32)
            y = gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=1)
            gl.store(act_ptr + (p + 1) * N + rn, y.to(gl.bfloat16))
            gl.thread_barrier()  # every thread's store is issued, and its reads of the tile done
            gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
            if p + 2 < PHASES:  # after the release, which this copy can then never hold up
                cp.async_copy_global_to_shared(buf, w_ptr + (p + 2) * N * K + tile)
            cp.commit_group()
        done = gl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == 2 * half - 1:
            gl.atomic_xchg(bar_ptr, 0)
            gl.atomic_xchg(bar_ptr + 1, 0)

    @gluon.jit
    def consume(buf, slot, act_ptr, p, N: gl.constexpr, K: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                L: gl.constexpr):
        """Phase p's products over the tile landed in `slot` (K / BK boxes of BN x BK): [BN] fp32."""
        KB: gl.constexpr = K // BK
        rk = gl.arange(0, BK, layout=gl.SliceLayout(0, L))
        acc = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, L))
        for j in gl.static_range(KB):
            w = buf.index(slot * KB + j).load(L)
            x = gl.load(act_ptr + p * N + j * BK + rk, cache_modifier=".cg").to(gl.float32)
            acc += gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=1)
        return acc

    @gluon.jit
    def ask(w_desc, buf, ready, phase, slot, pid, N: gl.constexpr, K: gl.constexpr, BN: gl.constexpr):
        BK: gl.constexpr = w_desc.block_type.shape[1]
        mbarrier.expect(ready.index(slot), BN * K * 2)
        for j in gl.static_range(K // BK):
            tma.async_copy_global_to_shared(w_desc, [phase * N + pid * BN, j * BK], ready.index(slot),
                                            buf.index(slot * (K // BK) + j))

    @gluon.jit
    def chained_tma(w_desc, act_ptr, bar_ptr, PHASES: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                    BN: gl.constexpr, STAGES: gl.constexpr):
        """Weights by bulk tensor copies into shared memory, an mbarrier a slot; joined by the arrivals count."""
        BK: gl.constexpr = w_desc.block_type.shape[1]
        KB: gl.constexpr = K // BK
        WARPS: gl.constexpr = gl.num_warps()
        L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
        pid = gl.program_id(0)
        grid = gl.num_programs(0)
        rn = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
        buf = gl.allocate_shared_memory(gl.bfloat16, [STAGES * KB, BN, BK], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        for s in gl.static_range(STAGES):
            if s < PHASES:
                ask(w_desc, buf, ready, s, s, pid, N, K, BN)
        for p in range(PHASES):
            if p > 0:
                seen = ld_acquire(bar_ptr)
                while seen < p * grid:
                    seen = ld_acquire(bar_ptr)
            slot = p % STAGES
            mbarrier.wait(ready.index(slot), (p // STAGES) & 1)
            acc = consume(buf, slot, act_ptr, p, N, K, BN, BK, L)
            gl.store(act_ptr + (p + 1) * N + rn, acc.to(gl.bfloat16))
            gl.thread_barrier()  # every thread's store is issued, and its reads of the slot done
            gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
            if p + STAGES < PHASES:  # after the release, as in chained_smem
                ask(w_desc, buf, ready, p + STAGES, slot, pid, N, K, BN)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
        done = gl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            gl.atomic_xchg(bar_ptr, 0)
            gl.atomic_xchg(bar_ptr + 1, 0)

    @gluon.jit
    def ws_load(w_desc, buf, ready, free, pid, PHASES: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                BN: gl.constexpr, STAGES: gl.constexpr):
        """The loader warp: phase p's tile into slot p % STAGES once the slot is free."""
        for p in range(PHASES):
            slot = p % STAGES
            mbarrier.wait(free.index(slot), ((p // STAGES) & 1) ^ 1)  # a fresh mbarrier passes parity 1
            ask(w_desc, buf, ready, p, slot, pid, N, K, BN)

    @gluon.jit
    def ws_compute(act_ptr, bar_ptr, buf, ready, free, pid, grid, PHASES: gl.constexpr, N: gl.constexpr,
                   K: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, L: gl.constexpr):
        rn = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
        for p in range(PHASES):
            if p > 0:
                seen = ld_acquire(bar_ptr)
                while seen < p * grid:
                    seen = ld_acquire(bar_ptr)
            slot = p % STAGES
            mbarrier.wait(ready.index(slot), (p // STAGES) & 1)
            acc = consume(buf, slot, act_ptr, p, N, K, BN, BK, L)
            gl.thread_barrier()  # every warp has read the slot
            fence_async_shared()  # ... before the copy that refills it
            mbarrier.arrive(free.index(slot), count=1)
            gl.store(act_ptr + (p + 1) * N + rn, acc.to(gl.bfloat16))
            gl.thread_barrier()  # every thread's store is issued
            gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        done = gl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == grid - 1:
            gl.atomic_xchg(bar_ptr, 0)
            gl.atomic_xchg(bar_ptr + 1, 0)

    @gluon.jit
    def chained_ws(w_desc, act_ptr, bar_ptr, PHASES: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                   BN: gl.constexpr, STAGES: gl.constexpr):
        """Weights by a loader warp (bulk tensor copies, STAGES slots); phases joined by the arrivals count."""
        BK: gl.constexpr = w_desc.block_type.shape[1]
        KB: gl.constexpr = K // BK
        L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
        pid = gl.program_id(0)
        grid = gl.num_programs(0)
        buf = gl.allocate_shared_memory(gl.bfloat16, [STAGES * KB, BN, BK], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(free.index(s), count=1)
        gl.warp_specialize([
            (ws_compute, (act_ptr, bar_ptr, buf, ready, free, pid, grid, PHASES, N, K, BN, BK, STAGES, L)),
            (ws_load, (w_desc, buf, ready, free, pid, PHASES, N, K, BN, STAGES)),
        ], [1], [24])

    return chained_smem, chained_tma, chained_ws, alternating_smem


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def launcher(mode: str, phases: int, warps: int, w, act, bar):
    """(run, read): run() launches the chain once this way; read() is then its activations, like `act`."""
    chained, one_phase, chained_tags, alternating = kernels()
    read = None
    if mode.startswith(("tma", "ws")):
        from triton.experimental.gluon.language import NVMMASharedLayout
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        kernel = gluon_kernels()[1 if mode.startswith("tma") else 2]
        desc = TensorDescriptor.from_tensor(w.view(-1, K), [BN, BK_TMA], NVMMASharedLayout(0, 16, 2))
        extra = {"maxnreg": 128} if mode.startswith("ws") else {}  # the loader warp's 24 need a kernel bound

        def fn():
            kernel[(GRID,)](desc, act, bar, PHASES=phases, N=N, K=K, BN=BN, STAGES=int(mode[-1]), num_warps=warps,
                            **extra)
    elif mode.startswith(("smem", "tagged")):
        chained_smem = gluon_kernels()[0]
        tags = mode.startswith("tagged")
        stages = 2 if mode in ("smem_free", "smem_resident") else int(mode[-1])
        words, state, read = tagged_words(act) if tags else (act, bar, None)

        def fn():
            chained_smem[(GRID,)](w, words, state, PHASES=phases, N=N, K=K, BN=BN, STAGES=stages,
                                  WAIT=mode != "smem_free", STREAM=mode != "smem_resident", TAGS=tags,
                                  num_warps=warps)
    elif mode == "tag_regs":
        words, state, read = tagged_words(act)

        def fn():
            chained_tags[(GRID,)](w, words, state, PHASES=phases, N=N, K=K, BN=BN, PRODUCERS=GRID, num_warps=warps)
    elif mode == "alternate_smem":
        alternating_smem = gluon_kernels()[3]
        opts = dict(PHASES=phases, N=N, K=K, BN=BN, num_warps=warps)
        require_resident(alternating_smem.warmup(w, act, bar, grid=(2 * GRID,), **opts), 2 * GRID, warps)

        def fn():
            alternating_smem[(2 * GRID,)](w, act, bar, **opts)
    elif mode.startswith("alternate"):
        opts = dict(PHASES=phases, N=N, K=K, BN=BN, MIXED=mode == "alternate_mixed", ONE=mode == "alternate_one",
                    num_warps=warps)
        require_resident(alternating.warmup(w, act, bar, grid=(2 * GRID,), **opts), 2 * GRID, warps)

        def fn():
            alternating[(2 * GRID,)](w, act, bar, **opts)
    elif mode.startswith("launches"):
        pdl = {"PDL": True, "launch_pdl": True} if mode == "launches_pdl" else {"PDL": False}

        def fn():
            for p in range(phases):
                one_phase[(GRID,)](w, act, bar, p, N=N, K=K, BN=BN, num_warps=warps, STAMPS=False, **pdl)
    else:
        def fn():
            chained[(GRID,)](w, act, bar, bar, PHASES=phases, WAY=WAY[mode.removesuffix("_flag").removesuffix("_one")],
                             N=N, K=K, BN=BN, FLAG=mode.endswith("_flag"), FLAG_AT=FLAG_AT, STAMPS=False,
                             ONE=mode.endswith("_one"), num_warps=warps)
    return fn, read or (lambda: act)


def require_resident(compiled, grid: int, warps: int) -> None:
    """Refuse a grid the GPU cannot hold at once (its barrier would never open)."""
    from engine.kernels.predictor_pass import resident_programs

    compiled._init_handles()  # loads the binary: n_regs is known from here
    fits = resident_programs(compiled, 0, warps, per_sm=grid)
    if fits < grid:
        raise RuntimeError(f"{grid} programs of {compiled.n_regs} registers x {warps} warps: {fits} fit at once")


def tagged_words(act):
    """(words, state, read) of the tag ways: the activations as int32 words (the input's tag 0), their
    [exits, epoch] pair, and read() giving the words back as bf16 activations."""
    words = act.view(torch.int16).to(torch.int32) & 0xFFFF
    state = torch.zeros(2, dtype=torch.int32, device=act.device)
    return words, state, lambda: (words & 0xFFFF).to(torch.int16).view(torch.bfloat16)


def final_activation(mode: str, phases: int, warps: int, w, act, bar):
    """The chain's last activation from a fresh copy of the first, joined this way (one eager launch)."""
    run, read = launcher(mode, phases, warps, w, act.clone(), bar)
    run()
    torch.cuda.synchronize()
    return read()[phases * N:].float()


def measure(mode: str, phases: int, warps: int, w, act, bar) -> float:
    g = graph_of(launcher(mode, phases, warps, w, act, bar)[0])
    return best_of(lambda _: mean_gpu_ms(g.replay, 20), 5)


def chain_tensors(phases: int, k: int):
    """(weights, activations, barrier words) of a chain of `phases` N x k phases on this GPU, which must hold
    every program at once."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if GRID > sms:
        raise SystemExit(f"{GRID} programs need {GRID} SMs for the barrier (this GPU has {sms})")
    w = torch.randn(phases * N * k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    act = torch.randn((phases + 1) * N, device="cuda", dtype=torch.bfloat16)
    return w, act, torch.zeros(2 * FLAG_AT, dtype=torch.int32, device="cuda")


def main() -> None:
    global K
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=21)
    ap.add_argument("--warps", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--k", type=int, default=2048, help="each weight's columns (1024: 4 MB phases, as o_proj's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    K = args.k
    w, act, bar = chain_tensors(args.phases, K)
    rows = []
    print(f"{torch.cuda.get_device_name()}: {args.phases} phases of {N}x{K} bf16 ({N * K * 2 / 1e6:.1f} MB), "
          f"{GRID} programs", flush=True)
    print("| way | warps | us a phase | us for 1 phase | TB/s in the chain |\n|---|---|---|---|---|")
    for warps in args.warps:
        want = final_activation("launches", args.phases, warps, w, act, bar)
        for mode in args.modes:
            try:
                if mode not in WRONG:
                    got = final_activation(mode, args.phases, warps, w, act, bar)
                    err = ((got - want).abs().max() / want.abs().max()).item()
                    if err > 5e-2:  # rounding orders differ by ~1e-2 after 21 bf16 phases; a race is O(1)
                        raise AssertionError(f"final activations differ from launches' (max rel {err:.3g})")
                # Triton 3.6 cannot lower a 1-phase Gluon chain
                base = 2 if mode.startswith(("smem", "tagged", "tma", "ws", "alternate_smem")) else 1
                t1 = measure(mode, base, warps, w, act, bar)
                tn = measure(mode, args.phases, warps, w, act, bar)
            except Exception as exc:  # one way failing (registers, a hang guard) must not lose the others
                print(f"| {mode} | {warps} | failed: {type(exc).__name__}: {str(exc)[:120]} | | |", flush=True)
                continue
            per = (tn - t1) * 1000 / (args.phases - base)
            tbs = N * K * 2 / (per * 1e-6) / 1e12
            rows.append({"mode": mode, "warps": warps, "us_per_phase": per, "us_one_phase": t1 * 1000,
                         "base_phases": base, "tb_s": tbs})
            print(f"| {mode} | {warps} | {per:.2f} | {t1 * 1000:.2f} | {tbs:.2f} |", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "phases": args.phases, "n": N, "k": K,
                                        "programs": GRID, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
