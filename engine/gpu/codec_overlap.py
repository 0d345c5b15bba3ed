"""Whole-utterance codec decode that runs while the frames are still being generated.

A frame is a chain of ~700 small, latency-bound kernels that leaves most of the GPU idle, while the codec
is a few large convolutions (~0.2 ms of GPU time per frame at one take). Decoding each finished run of
16 frames on a side CUDA stream overlaps the two, so a request no longer waits for the whole codec after
its last frame: only the last, shorter run is left, decoded as one zero-padded piece. The decode is the
chunked stateful one (exact for any split, engine/codec/decoder.py) through the load-time piece graphs, so
the audio is that of `CodecGraphs.decode_utterance` and of a stream of the same codes.
"""
from __future__ import annotations

import torch

from .codec_graph import PIECES, CodecGraphs

# Frames per side-stream piece while the request runs. 16 rather than 32: the last piece, decoded after
# the last frame, is then at most a 16-frame one (3.7 ms on an H200 against 6.1 for 32: the request's tail
# p95 went 7.1 -> 4.8 ms), and the frames lose no more time to the codec; at 8 they lost 40% more
# (bench/results/request_timeline_h200_variants.json).
FLUSH_FRAMES = PIECES[1]


class OverlappedDecode:
    """Feed it the codes of each chunk as the decode loop yields them; `finish()` returns the audio."""

    def __init__(self, graphs: CodecGraphs, batch: int, ref_codes: torch.Tensor | None):
        self.graphs, self.batch = graphs, batch
        self.state = graphs.acquire(batch, self)
        self.main = torch.cuda.current_stream()
        self.side = torch.cuda.Stream()
        self.pending: list[torch.Tensor] = []
        self.parts: list[torch.Tensor] = []
        if self.state is None:  # a live stream holds this bucket's state: decode at the end instead
            return
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            if ref_codes is not None:
                graphs.prime(self.state, ref_codes, batch)
            else:
                self.state.zero_()

    @property
    def active(self) -> bool:
        return self.state is not None

    def tap(self, chunks):
        """Pass the decode loop's chunks through, decoding their codes on the side stream as they come. A
        chunk's codes are taken after its last frame (chunk.ready), not after a frame launched ahead of it,
        and the last chunk's go out at once as the final piece, so that piece runs beside such a frame."""
        for chunk in chunks:
            with chunk.on(self.side):
                self.push(chunk.codes.masked_fill(~chunk.valid[..., None], 0))
            if chunk.done:
                self._flush_rest()
            yield chunk

    def push(self, codes: torch.Tensor) -> None:
        """codes [B, k, Q] made on the side stream (frames past a take's end already zeroed)."""
        self.pending.append(codes)
        ready = sum(c.shape[1] for c in self.pending)
        if ready >= FLUSH_FRAMES:
            self._flush(ready - ready % FLUSH_FRAMES)

    def _flush(self, frames: int, final: bool = False) -> None:
        with torch.cuda.stream(self.side):
            codes = torch.cat(self.pending, 1) if len(self.pending) > 1 else self.pending[0]
            now, rest = codes[:, :frames], codes[:, frames:]
            self.pending = [rest] if rest.shape[1] else []
            self.parts.append(self.graphs.decode(now.transpose(1, 2), self.state, final=final))

    def _flush_rest(self) -> None:
        ready = sum(c.shape[1] for c in self.pending)
        if ready:  # the last frames: one padded piece (the state is released right after)
            self._flush(ready, final=True)

    def finish(self) -> torch.Tensor:
        """Audio [B, T * samples_per_frame] of every frame pushed, ready on the current stream."""
        self._flush_rest()
        self.main.wait_stream(self.side)
        for part in self.parts:
            part.record_stream(self.main)  # made on the side stream, read (and freed) on the main one
        self.release()
        if not self.parts:
            return torch.zeros(self.batch, 0, device=self.main.device)
        return torch.cat(self.parts, 1) if len(self.parts) > 1 else self.parts[0]

    def release(self) -> None:
        """Hand the bucket's state back (also on an interrupted request)."""
        if self.state is not None:
            self.graphs.release_owner(self)
