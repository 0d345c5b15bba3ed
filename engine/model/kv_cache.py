"""Static per-layer K/V buffers.

Buffers are allocated once and written in place, so a decode step never allocates and a CUDA graph can
capture it. Nothing tracks the valid length: the caller passes `start` to every forward, and positions
beyond it are never read.
"""
from __future__ import annotations

import torch


class KVCache:
    """Static per-layer K/V buffers, each [B, num_kv_heads, max_len, head_dim]: views of one tensor
    [2, num_layers, B, num_kv_heads, max_len, head_dim] (`store`), so a prompt's K/V reaches other rows
    in one copy for all layers instead of one launch per layer and buffer."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.store = torch.zeros(2, num_layers, batch, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        # Detached: each layer's buffer shares the store's memory but is its own tensor to autograd, as separate
        # buffers were (a write into one autograd view of the store would tie every layer's buffer to it).
        self.k: list[torch.Tensor] = [self.store[0, i].detach() for i in range(num_layers)]
        self.v: list[torch.Tensor] = [self.store[1, i].detach() for i in range(num_layers)]
        self.batch = batch
        self.max_len = max_len
        self.num_layers = num_layers

    def head(self, rows: int) -> KVCache:
        """The first `rows` rows of this cache as a cache of their own: views of the same memory."""
        view = KVCache.__new__(KVCache)
        view.store = self.store[:, :, :rows]
        view.k, view.v = [k[:rows] for k in self.k], [v[:rows] for v in self.v]
        view.batch, view.max_len, view.num_layers = rows, self.max_len, self.num_layers
        return view

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype if self.k else torch.float32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def copy_rows_from(self, other: KVCache, length: int, rows=None) -> None:
        """Copy the first `length` positions of a batch-1 cache into every row of this one, or into `rows`
        (a sequence of row indices, not a tensor) only: one copy for all layers per run of consecutive rows.
        Indices stay on the host: a device index made from a list is a blocking copy, which right after a
        prefill would make the host wait for the whole prefill before it could queue the first frame."""
        if other.batch != 1:
            raise ValueError(f"copy_rows_from expects a batch-1 source cache, got batch {other.batch}")
        if other.num_layers != self.num_layers:
            raise ValueError(f"layer count differs: {other.num_layers} vs {self.num_layers}")
        if not 0 <= length <= min(self.max_len, other.max_len):
            raise ValueError(f"length {length} exceeds a cache of max_len {min(self.max_len, other.max_len)}")
        if isinstance(rows, torch.Tensor):
            raise TypeError("copy_rows_from takes row indices as a list (a tensor would cost a host sync)")
        src = other.store[..., :length, :]
        for start, stop in [(0, self.batch)] if rows is None else runs(rows):
            self.store[:, :, start:stop, :, :length].copy_(src)  # broadcasts over the rows


def runs(rows) -> list[tuple[int, int]]:
    """[start, stop) of each run of consecutive indices in `rows`, in their order: [0, 1, 2, 5] -> (0, 3), (5, 6)."""
    out = []
    for r in map(int, rows):
        if out and out[-1][1] == r:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return out
