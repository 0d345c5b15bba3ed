"""Small helpers shared by the kernel modules (no Triton import here)."""
from __future__ import annotations


def next_pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def warps_for(block: int) -> int:
    return 1 if block <= 128 else 2 if block <= 512 else 4 if block <= 2048 else 8


class ContractError(RuntimeError):
    """A kernel was called outside its contract (shapes, strides, alignment)."""


def require(ok, what: str) -> None:
    """A kernel's call contract (strides, shapes): unlike assert it survives `python -O`, where a broken
    contract would silently compute garbage."""
    if not ok:
        raise ContractError(f"kernel call contract broken: {what}. This is a bug in the engine; please report it.")
