"""Static per-layer K/V buffers.

Buffers are allocated once and written in place, so a decode step never allocates and a CUDA graph can
capture it. Nothing tracks the valid length: the caller passes `start` to every forward, and positions
beyond it are never read.
"""
from __future__ import annotations

import torch


class KVCache:
    """Static per-layer K/V buffers, each [B, num_kv_heads, max_len, head_dim]."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (batch, num_kv_heads, max_len, head_dim)
        self.k: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.batch = batch
        self.max_len = max_len
        self.num_layers = num_layers

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype if self.k else torch.float32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def copy_rows_from(self, other: "KVCache", length: int, rows=None) -> None:
        """Copy the first `length` positions of a batch-1 cache into every row of this one, or into `rows`
        (a list or long tensor of row indices) only."""
        if other.batch != 1:
            raise ValueError(f"copy_rows_from expects a batch-1 source cache, got batch {other.batch}")
        if other.num_layers != self.num_layers:
            raise ValueError(f"layer count differs: {other.num_layers} vs {self.num_layers}")
        if not 0 <= length <= min(self.max_len, other.max_len):
            raise ValueError(f"length {length} exceeds a cache of max_len {min(self.max_len, other.max_len)}")
        if rows is not None:
            idx = torch.as_tensor(rows, dtype=torch.long, device=self.k[0].device if self.k else None)
            for dst, src in zip(self.k + self.v, other.k + other.v):
                dst[idx, :, :length] = src[:, :, :length]  # broadcasts over the chosen rows
            return
        for dst, src in zip(self.k + self.v, other.k + other.v):
            dst[:, :, :length].copy_(src[:, :, :length])  # broadcasts over the batch dimension
