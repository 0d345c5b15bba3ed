"""The skinny linear kernel's launch plan (pure Python, testable without a GPU): FMA or tensor-core path, tile
shape, split-K and what the last arrival unrolls (engine/kernels/linear.py describes the kernel)."""
from __future__ import annotations

from ._util import next_pow2

# Launch shapes, chosen from the decode-shape sweeps (`bench/kernel_bench.py --linear-sweep`) and whole-frame
# timings (docs/PERFORMANCE_NOTES.md). Up to FMA_ROWS rows the matmul runs as FMAs over [rows, 8, 1024] tiles
# with 4 programs per SM. Above, on tensor cores (rows padded to 16) with one program per SM: plain matmuls as
# [16+, 32, 256] tiles of rows x weight columns, those with a fused prologue as the swapped product over
# [64, 16+, 256] tiles (64 weight rows on the MMA's M side), so each program's prologue work (the row's sum of
# squares, the SiLU) is spread over more weight. Where the 64-row tiles alone would be more than one wave of
# programs, the plain tiles run instead. PROGRAMS_PER_SM sets how far K is split when N is narrow.
FMA_ROWS = 2
_DOT = {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3, "PROGRAMS_PER_SM": 1, "SWAP_AB": False}
CONFIG = {"fma": {"BLOCK_N": 8, "BLOCK_K": 1024, "num_warps": 4, "num_stages": 3, "PROGRAMS_PER_SM": 4},
          "dot": _DOT,
          "dot_rms_norm": {**_DOT, "SWAP_AB": True, "BLOCK_N": 64},
          "dot_silu_mul": {**_DOT, "SWAP_AB": True, "BLOCK_N": 64}}

# On the tensor-core path a SwiGLU prologue over more than this K starves the loads: there the SwiGLU runs as its
# own launch (silu_mul.py) and the kernel does the matmul and the residual.
SWIGLU_IN_DOT_MAX_K = 4096

# From this many rows a decode linear's matmul runs on cuBLAS (its RMSNorm prologue as the Triton RMSNorm, a SwiGLU
# as the Triton SwiGLU, bias and residual in cuBLAS's epilogue), unless launches are planned alike for batch
# invariance. Frames run at the graph buckets' rows: a 0.6B frame of 32 rows took 4.7 ms this way against 5.1 on the
# Triton linear, one of 16 rows 4.6 against 3.9 (docs/PERFORMANCE_NOTES.md, linear at many rows).
CUBLAS_FROM_ROWS = 17

# The last split-K arrival sums up to this many partials in one unrolled round of loads; more in a loop.
UNROLL_SPLITS = 16


def unrolled_splits(splits: int) -> int:
    """`_finish`'s SP for a launch of `splits` programs per column block (0: the loop)."""
    return next_pow2(splits) if 1 < splits <= UNROLL_SPLITS else 0


# The RMSNorm prologue's sum of squares over the rows is unrolled (its loads go out together) while the rows'
# tiles hold at most this many values; past it the loop keeps the registers (unrolled, 16 rows of a 2048-wide
# row would spill).
UNROLL_NORM_VALUES = 16 * 1024


def norm_steps(k: int, block_k: int, block_m: int) -> int:
    """The kernel's SS_STEPS for block_m rows K wide, read in block_k steps (0: the loop)."""
    steps = -(-k // block_k)
    return steps if steps * block_k * block_m <= UNROLL_NORM_VALUES else 0


def plan(m: int, n: int, k: int, config=None, target=None, sms: int = 132, prologue: str = "none") -> dict:
    """Launch parameters for an [m, k] x [k, n] decode matmul (pure Python, testable without a GPU).

    `config` overrides the chosen path's CONFIG entries ("FMA_ROWS" included); `target` the program count.
    "PROLOGUE" is the prologue the kernel runs: a long SwiGLU on tensor cores is left to torch (none)."""
    fma_rows = (config or {}).get("FMA_ROWS", FMA_ROWS)
    use_dot = m > fma_rows
    if prologue == "silu_mul" and use_dot and k > SWIGLU_IN_DOT_MAX_K:
        prologue = "none"
    path = "fma" if not use_dot else "dot" if prologue == "none" else f"dot_{prologue}"
    if path != "dot" and use_dot and -(-n // CONFIG[path]["BLOCK_N"]) > CONFIG[path]["PROGRAMS_PER_SM"] * sms:
        path = "dot"  # more swapped tiles than one wave of programs (1.7B gate_up): the plain ones are faster
    cfg = {**CONFIG[path], **(config or {})}
    target = cfg["PROGRAMS_PER_SM"] * sms if target is None else target
    block_n, block_k = cfg["BLOCK_N"], cfg["BLOCK_K"]
    if use_dot:
        block_n = max(16, block_n)
    n_blocks = -(-n // block_n)
    k_blocks = -(-k // block_k)
    splits = max(1, min(k_blocks, round(target / n_blocks)))
    chunk = -(-k_blocks // splits) * block_k
    splits = -(-k // chunk)  # no empty programs
    block_m = max(16, next_pow2(m)) if use_dot else next_pow2(m)
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
            "BLOCK_M": block_m, "USE_DOT": use_dot, "SWAP_AB": use_dot and bool(cfg.get("SWAP_AB", False)),
            "n_blocks": n_blocks, "splits": splits, "chunk": chunk, "PROLOGUE": prologue, "target": target}


def one_tile_row(n: int) -> bool:
    """Whether a row n wide is one FMA tile of K for the linear that takes it, so a deferred sum's consumer makes
    it once (a wider row would be made twice, for the norm and for the product, which costs more than the
    deferral saves)."""
    return n <= CONFIG["fma"]["BLOCK_K"]


def defers_here(p: dict, n: int) -> bool:
    """Whether a split launch planned as `p` with n output columns leaves its sum to the next linear
    (split_sum.py): on the FMA path only (the tensor-core path's tiles of partials overflow shared memory: 249 KB
    at 16 rows) and where the consumer takes the row in one tile."""
    return not p["USE_DOT"] and one_tile_row(n)
