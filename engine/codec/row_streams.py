"""Streaming codec decode for the rows of a mixed batch (Engine.stream_batch): one causal state per row.

Rows of a batch start and end at different frames, and a new row may take a freed slot mid-run, so every
row carries its own `DecodeState` (conv tails, transformer K/V, frame position) and each push continues
that row's utterance: a row's pushes, concatenated, equal the one-pass decode of its frames, as
`StreamingDecoder` does for one request.

The decoder's state has one frame position for all its batch rows, so rows at different positions cannot
share a batched decode: each row decodes at batch 1. With codec graphs the rows take turns on the one-row
bucket's captured state: the row being decoded has its buffers in it, and switching rows copies them out
to that row's own copy and the next row's in (a few MB, device to device), so every row replays graphs.
"""
from __future__ import annotations

import torch

from .decoder import CodecDecoder, DecodeState


class RowStreams:
    def __init__(self, decoder: CodecDecoder, graphs=None):
        self.decoder = decoder
        self.graphs = graphs
        # None when no graphs, or another live stream holds the one-row state: rows then decode eagerly.
        self.shared = graphs.acquire(1, self) if graphs is not None else None
        self.saved: dict = {}  # row -> its DecodeState (eager) or its snapshot (graphs; None while in `shared`)
        self.current = None  # graphs: the row whose state sits in `shared`

    @torch.inference_mode()
    def open(self, row: int, ref_codes: torch.Tensor | None = None) -> None:
        """Start `row`'s utterance, after the ICL reference codes [R, Q] (left context, never emitted)."""
        if ref_codes is not None:
            ref_codes = ref_codes.to(next(self.decoder.parameters()).device)
        if self.shared is None:
            state = DecodeState()
            if ref_codes is not None:
                self.decoder(ref_codes.t()[None], state)
            self.saved[row] = state
            return
        self._park()
        if ref_codes is not None:
            self.decoder.check_codes(ref_codes.t()[None])
            self.graphs.prime(self.shared, ref_codes, 1)  # the state after a reference is cached per voice
        else:
            self.shared.zero_()
        self.saved[row] = None
        self.current = row

    @torch.inference_mode()
    def push(self, row: int, codes: torch.Tensor) -> torch.Tensor:
        """`row`'s next frames [k, Q] (k >= 1) -> their audio [k * samples_per_frame] on the model device."""
        codes = codes.t()[None]
        self.decoder.check_codes(codes)
        if self.shared is None:
            return self.decoder(codes, self.saved[row], check=False)[0]
        if self.current != row:
            self._park()
            self.shared.restore(self.saved[row])
            self.current = row
        return self.graphs.decode(codes, self.shared)[0]

    def _park(self) -> None:
        """Copy the state of the row in `shared` out to its own buffers."""
        if self.current is None:
            return
        mine = self.saved.get(self.current)
        if mine is None:
            self.saved[self.current] = self.shared.snapshot()
        else:
            for dst, src in zip(mine, self.shared.buffers()):
                dst.copy_(src)
        self.current = None

    def close(self, row: int) -> None:
        """`row` has ended: drop its state."""
        self.saved.pop(row, None)
        if self.current == row:
            self.current = None

    def release(self) -> None:
        """Drop every row's state and hand the one-row graph state back (the stream ended or was closed)."""
        self.saved.clear()
        self.current = None
        if self.shared is not None:
            self.graphs.release_owner(self)
            self.shared = None
