"""Small helpers shared by the kernel modules (no Triton import here)."""
from __future__ import annotations

import functools

import torch


def next_pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def warps_for(block: int) -> int:
    return 1 if block <= 128 else 2 if block <= 512 else 4 if block <= 2048 else 8


@functools.cache
def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (launch plans size their grids by it); 132, an H100's,
    for anything else (the interpreter's CPU tensors)."""
    if torch.device(device).type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A time-major [B, L, C] whose rows are contiguous within each batch row (any batch stride, e.g. a slice of
    time) as it is, anything else as a contiguous copy."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


class ContractError(RuntimeError):
    """A kernel was called outside its contract (shapes, strides, alignment)."""


def require(ok, what: str) -> None:
    """A kernel's call contract (strides, shapes): unlike assert it survives `python -O`, where a broken
    contract would silently compute garbage."""
    if not ok:
        raise ContractError(f"kernel call contract broken: {what}. This is a bug in the engine; please report it.")
