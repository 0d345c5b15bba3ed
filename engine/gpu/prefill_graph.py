"""The talker prefill as CUDA graphs in length buckets, captured at load.

Run op by op, a prefill of any length costs ~1,500 kernel launches and, the first time a length is seen,
library set-up on top. Here a prompt of L tokens is copied into a static input of the next bucket's
length B >= L, the rows L..B-1 zero, and the bucket's graph is replayed. The prefill attention is causal,
so the padding rows come after every real row and cannot change it: row L-1 is the same hidden state as
an exact-length prefill (only the matmul shapes differ).

The graphs write K/V into the frame runner's one-row cache (its batch-1 FrameState): a one-take request
decodes in that very cache, so its prefill needs no copy; rows of a larger batch get the first L positions
copied into their slots, as the eager prefill (engine.slots.prefill_into) does. The padding rows' K/V land
at positions L..B-1, which a row at position L never reads: the frame attention masks every position past
its own (as it masks whatever an earlier request left there), so the result is the same as with a copy.

Given the runner's FusedStack, a bucket's graph runs FusedStack.prefill (~10 launches a layer, RoPE tables
made once here) instead of the module's op-by-op forward (~53); without one, the module's forward.
"""
from __future__ import annotations

import time

import torch

from ..model.kv_cache import KVCache
from .capture import capture

# Padding costs little next to the launches it saves, and each bucket adds a little to the load. Longer prompts
# run eagerly, where their own compute already outweighs the launches.
PREFILL_BUCKETS = (64, 128, 256, 512)


class PrefillGraphs:
    def __init__(self, talker, cache: KVCache | None = None, buckets=PREFILL_BUCKETS, fused=None):
        """`cache`: the batch-1 cache the graphs write (a one-take run decodes in it: no copy); default their
        own. Buckets longer than it are left out (those prompts prefill eagerly). `fused`: the talker's
        FusedStack (engine/gpu/fused_layers.py), or None for the module's forward."""
        self.talker = talker
        self.fused = fused
        self.cache = cache if cache is not None else talker.new_cache(1, max(buckets))
        if self.cache.batch != 1:
            raise ValueError(f"prefill graphs write a batch-1 cache (got batch {self.cache.batch})")
        self.buckets = tuple(b for b in buckets if b <= self.cache.max_len)
        w = talker.model.codec_embedding.weight
        self.x = torch.zeros(1, max(self.buckets, default=1), talker.cfg.hidden_size, dtype=w.dtype, device=w.device)
        self.rope = None
        if fused is not None:  # positions 0..max-1, made once (a bucket reads its first rows)
            self.rope = fused.rope(torch.arange(self.x.shape[1], device=w.device), w.dtype)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.capture_seconds = 0.0
        self.replays = 0

    def bucket(self, length: int) -> int | None:
        return next((b for b in self.buckets if b >= length), None)

    @torch.inference_mode()
    def capture_all(self) -> None:
        for b in self.buckets:
            if b in self.graphs:
                continue
            t0 = time.perf_counter()
            graph, out = capture(lambda b=b: self._body(b), self.pool)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[b] = (graph, out)
            self.capture_seconds += time.perf_counter() - t0

    def _body(self, b: int) -> torch.Tensor:
        if self.fused is None:
            return self.talker.model(self.x[:, :b], self.cache, 0)
        return self.fused.prefill(self.x[:, :b], self.cache, (self.rope[0][:b], self.rope[1][:b]))

    def run(self, prompt, cache: KVCache, rows) -> torch.Tensor | None:
        """Prefill `prompt` into rows `rows` (a list) of `cache` (as engine.slots.prefill_into does): the last
        hidden state [1, H], or None when no captured bucket holds the prompt (the caller prefills eagerly).
        Row 0 of the graphs' own cache is written in place (no copy)."""
        length = prompt.prefill.shape[1]
        b = self.bucket(length)
        if b is None or b not in self.graphs:
            return None
        graph, out = self.graphs[b]
        self.x[:, :length].copy_(prompt.prefill)
        self.x[:, length:b].zero_()
        graph.replay()
        self.replays += 1
        if cache is not self.cache or list(rows) != [0]:
            cache.copy_rows_from(self.cache, length, rows=rows)
        return out[:, length - 1].clone()

    def release(self) -> None:
        self.graphs.clear()
        self.pool = None
