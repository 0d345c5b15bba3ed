"""The streaming codec decoder as CUDA graphs: one graph per (batch, chunk frames).

A chunked decode continues a `DecodeState` whose buffers have static shapes and are only written in
place (engine/codec/decoder.py), so the chunk step can be captured once and replayed for every later
chunk of that size. `CodecGraphs` keeps one state per batch size (the graphs of that batch read and
write its buffers), captures lazily, and runs any chunk without a graph (the last, shorter chunk of a
stream, the ICL reference prefix) eagerly on the SAME buffers, so the audio stays continuous.

Because a batch size has one shared state, one stream at a time may use it: `acquire` hands it to a
StreamingDecoder while no other live decoder holds it; a second, concurrent stream gets None and
decodes eagerly on a private state (still exact, just not graphed).
"""
from __future__ import annotations

import logging
import time
import weakref

import torch

from ..codec.decoder import CodecDecoder, DecodeState
from .capture import capture as capture_graph

log = logging.getLogger(__name__)

WARM_CHUNKS = (4, 8)  # the streaming node's common chunk sizes, captured at load time for batch 1


class CodecGraphs:
    """Owns the per-batch decode states and the captured chunk graphs of one CodecDecoder."""

    def __init__(self, decoder: CodecDecoder, capture: bool = True):
        self.decoder = decoder
        self.capture_enabled = capture  # False: same bookkeeping, every chunk eager (CPU tests)
        self.states: dict[int, DecodeState] = {}
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._owners: dict[int, weakref.ref] = {}
        self.pool = None
        self.capture_seconds = 0.0
        self.graphed_chunks = 0
        self.eager_chunks = 0
        self.private_streams = 0  # streams that found their batch's state busy and decoded eagerly
        self.failure: str | None = None  # first capture error; no capture is tried after one

    @property
    def captures(self) -> int:
        """Successful captures: one per (batch, chunk size), a replayed size never counts twice."""
        return len(self.graphs)

    def stats(self) -> dict:
        return {"captured": sorted(self.graphs), "captures": self.captures, "capture_s": self.capture_seconds,
                "graphed_chunks": self.graphed_chunks, "eager_chunks": self.eager_chunks,
                "private_streams": self.private_streams, "failure": self.failure}

    def release(self) -> None:
        self.graphs.clear()
        self.states.clear()
        self._owners.clear()
        self.pool = None
        self.capture_enabled = False  # a decoder still holding a state keeps working, eagerly

    # -- states --------------------------------------------------------------------------------

    @torch.inference_mode()
    def state(self, batch: int) -> DecodeState:
        """The shared state of `batch`, every buffer allocated (outside any capture, on this stream)."""
        if batch not in self.states:
            p = next(self.decoder.parameters())
            state = DecodeState()
            codes = torch.zeros(batch, self.decoder.cfg.num_quantizers, 1, dtype=torch.long, device=p.device)
            self.decoder(codes, state, check=False)  # one frame allocates every tail, K/V and the position
            self.states[batch] = state.zero_()
        return self.states[batch]

    def acquire(self, batch: int, owner) -> DecodeState | None:
        """The shared state of `batch` for `owner`, or None while another live owner holds it."""
        ref = self._owners.get(batch)
        holder = ref() if ref is not None else None
        if holder is not None and holder is not owner:
            self.private_streams += 1
            log.info("codec graphs: the batch-%d decode state is in use by another stream; decoding eagerly", batch)
            return None
        state = self.state(batch)
        self._owners[batch] = weakref.ref(owner)  # freed with the owner (e.g. an exhausted Engine.stream)
        return state

    # -- capture and replay --------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self, batch: int, frames: int) -> bool:
        """Capture the graph for (batch, frames) unless it exists; False if capture is off or failed."""
        key = (batch, frames)
        if key in self.graphs:
            return True
        if not self.capture_enabled or self.failure is not None:
            return False
        t0 = time.perf_counter()
        state = self.state(batch)
        saved = state.snapshot()
        codes = torch.zeros(batch, self.decoder.cfg.num_quantizers, frames, dtype=torch.long,
                            device=state.frames.device)
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph, wav = capture_graph(lambda: self.decoder(codes, state, check=False), self.pool)
        except Exception as exc:  # noqa: BLE001  any failure: say so once, then decode eagerly
            self.failure = f"{type(exc).__name__}: {exc}"
            log.warning("codec CUDA graph capture failed (batch %d, %d-frame chunks: %s); decoding eagerly",
                        batch, frames, self.failure)
            return False
        finally:
            state.restore(saved)  # the warm-up decodes must not advance the real state
        self.graphs[key] = (graph, codes, wav)
        self.capture_seconds += time.perf_counter() - t0
        return True

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, state: DecodeState, capture: bool = True) -> torch.Tensor:
        """codes [B, Q, k] -> audio [B, k * samples_per_frame], continuing `state`.

        Replays the (B, k) graph when `state` is the shared state of batch B and a graph exists (or may be
        captured now: `capture`); otherwise decodes eagerly on `state` itself.
        """
        batch, frames = codes.shape[0], codes.shape[-1]
        shared = self.states.get(batch) is state
        if shared and capture:
            self.capture(batch, frames)
        entry = self.graphs.get((batch, frames)) if shared else None
        if entry is None:
            self.eager_chunks += 1
            return self.decoder(codes, state, check=False)
        graph, static_codes, wav = entry
        static_codes.copy_(codes)
        graph.replay()
        self.graphed_chunks += 1
        return wav.clone()  # the static output is overwritten by the next replay
