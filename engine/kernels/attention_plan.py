"""The attention kernel's launch plan (pure Python, testable without a GPU): one program per (row, kv head) for
short windows, split-KV chunks for long ones (engine/kernels/attention.py describes both)."""
from __future__ import annotations

from ._util import next_pow2

# Split-KV launch plan. Windows below SPLIT_MIN_WINDOW run one program per (row, kv head). Longer ones
# are cut into chunks (multiples of BLOCK_N, at least MIN_CHUNK positions) so that B * nkv * splits is
# about PROGRAMS_PER_SM programs per SM. USE_DOT: the two products on tensor cores (query heads padded to
# 16 rows; bf16 / fp16 probabilities rounded to the dtype before the V product, as the torch path does)
# instead of FMAs. The shape is the fastest of `bench/kernel_bench.py --attention` at the talker's shapes
# (docs/PERFORMANCE_NOTES.md), and beats torch's four ops at every window.
SPLIT_MIN_WINDOW = 128
# rope_attention (q/k norm + RoPE + cache write fused in front of the attention) pays from this many rows
# up: at one row the program that writes k / v must finish that before its window loads start (and a split
# program normalises its query heads padded to 16 rows), which costs more than the launch it saves.
FUSE_MIN_ROWS = 4
CONFIG = {"BLOCK_N": 32, "MIN_CHUNK": 32, "PROGRAMS_PER_SM": 4, "num_warps": 4, "num_stages": 2, "USE_DOT": True,
          "ONE_WARPS": 4, "FUSED_ONE_WARPS": 2, "COMBINE_BLOCK": 32}
# ONE_WARPS / FUSED_ONE_WARPS: warps of the one-program path (short windows), without / with rope_attention's
# fused prologue. The prologue re-reads the token's new k / v rows from the cache after a barrier: taking them
# from registers instead needs more registers than the split kernel has and is slower.
# COMBINE_BLOCK: splits the last program combines per round of loads. Up to this many it loads every split's
# partial at once (one L2 round trip instead of two: the maxima, then the rest); more go in rounds of this size.


def plan(b: int, nkv: int, window: int, sms: int = 132, chunk: int | None = None, config=None,
         block_n: int = 16, fused: bool = False, device_length: bool = False) -> dict:
    """Launch parameters (pure Python, testable without a GPU).

    chunk: positions per split program; None lets the plan choose (one program per (row, kv head) below
    SPLIT_MIN_WINDOW), a chunk >= window forces one program. `config` overrides CONFIG entries;
    `block_n` is the block of the one-program path; `fused`: rope_attention's launch.
    device_length: one split grid for every row length up to `window` (the caches' room). Each row's program
    cuts its own length, read on the device, as this plan cuts a window of that length: at most `want`
    chunks of at least `chunk` positions (MIN_CHUNK when None), in multiples of BLOCK_N. The grid holds the
    most chunks any length can need; the programs past a row's own count return at once."""
    cfg = {**CONFIG, **(config or {})}
    want = max(1, cfg["PROGRAMS_PER_SM"] * sms // max(1, b * nkv))
    if device_length:
        least = chunk or cfg["MIN_CHUNK"]
        return _split_plan(cfg, max(1, min(want, -(-window // least))), least, want)
    one = {"splits": 1, "chunk": window, "BLOCK_N": block_n, "num_warps": cfg["FUSED_ONE_WARPS" if fused else "ONE_WARPS"]}
    if chunk is None:
        if window < SPLIT_MIN_WINDOW:
            return one
        step = cfg["BLOCK_N"]
        chunk = max(cfg["MIN_CHUNK"], -(-window // want))
        chunk = -(-chunk // step) * step
    if chunk >= window:
        return one
    splits = -(-window // chunk)
    return _split_plan(cfg, splits, chunk, splits)


def _split_plan(cfg: dict, splits: int, chunk: int, want: int) -> dict:
    """The split path's launch: `splits` programs a (row, kv head) over chunks of `chunk` positions (with device
    lengths, the least chunk), each row spread over at most `want` of them."""
    block = min(cfg["BLOCK_N"], next_pow2(chunk))
    if cfg["USE_DOT"]:
        block = max(16, block)
    sp = next_pow2(splits)
    return {"splits": splits, "chunk": chunk, "want": want, "BLOCK_N": block, "num_warps": cfg["num_warps"],
            "num_stages": cfg["num_stages"], "USE_DOT": bool(cfg["USE_DOT"]), "SP": sp,
            "SB": min(sp, cfg["COMBINE_BLOCK"])}
