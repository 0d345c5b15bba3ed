"""The server's backend over engine replicas on Ray Serve (`serve --ray`), with the local Backend's interface:
`await submit(...)` (async-iterable of engine Chunks, `cancel()`), `extract_voice`, `stats()`, `counts`,
`max_queue`, `close()`, plus `replicas()` for /health.

Every call goes through one DeploymentHandle, so Ray Serve's router picks the replica (the one with fewer
requests in flight, of two drawn at random) and holds requests past every replica's max_ongoing_requests in
its own queue. The backend bounds that queue itself: past `capacity` requests in flight (every replica's
max_ongoing_requests, plus the server's --max-queue) a request gets QueueFullError (503) at once. Ray Serve's
own bound (max_queued_requests) is left off: it also counts requests still being handed to a replica, so a
burst would be refused while replicas have room.
"""
from __future__ import annotations

import asyncio
import logging

import numpy as np
import torch

from ..engine import Chunk
from ..errors import QueueFullError
from .backend import Counts

log = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 2.0  # /health waits this long for the replicas' stats, then shows the ones that answered


def unwrapped(exc: BaseException) -> BaseException:
    """The error a replica raised, out of Ray's wrapper, so that the API answers it as the local server would
    (a Qwen3TTSError is the request's 4xx)."""
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError) and isinstance(exc.cause, Exception):
        return exc.cause
    return exc


class RayTicket:
    """One request's chunks from a replica's streaming response; `cancel()` cancels that response, which ends
    the replica's generator and cancels its engine ticket."""

    def __init__(self, response, backend: RayBackend):
        self._response = response
        self._backend = backend
        self._started = self._done = False
        backend._waiting += 1
        backend._open += 1

    def cancel(self) -> None:
        if not self._done:
            self._response.cancel()
            self._end("cancelled")

    def __aiter__(self):
        return self

    async def __anext__(self) -> Chunk:
        if self._done:
            raise StopAsyncIteration
        try:
            piece = await self._response.__anext__()
        except StopAsyncIteration:
            self._end("completed")
            raise
        except Exception as exc:  # noqa: BLE001 - each is re-raised, Ray's wrapper taken off
            self._end("failed")
            raise unwrapped(exc) from None
        if not self._started:
            self._started = True
            self._backend._waiting -= 1
        return Chunk(item=0, take=piece.take, audio=torch.from_numpy(np.array(piece.audio, np.float32)),
                     codes=torch.from_numpy(np.array(piece.codes)), index=piece.index, final=piece.final,
                     elapsed_s=piece.elapsed_s)

    def _end(self, outcome: str) -> None:
        self._done = True
        counts = self._backend.counts
        setattr(counts, outcome, getattr(counts, outcome) + 1)
        if not self._started:
            self._backend._waiting -= 1
        self._backend._open -= 1


class RayBackend:
    def __init__(self, handle, replicas: int, rows: int, per_replica: int, max_queue: int, board=None,
                 on_close=None, *, engine):
        self.handle = handle
        self.engine = engine  # what a replica's engine is (its info and config), for GET /v1/engine
        self.max_queue = max_queue
        self.rows = rows  # each replica's
        self.capacity = replicas * per_replica + max_queue  # requests in flight, beyond which one gets 503
        self._each: list = []  # the replicas' stats, as /health last read them
        self.board = board  # the replicas' stats (engine/serve/ray_board.py)
        self._stream = handle.options(stream=True)
        self.replica_count = replicas
        self.counts = Counts()
        self._waiting = 0  # sent, no audio back yet: in Ray Serve's queue or a replica's
        self._open = 0
        self._on_close = on_close

    async def submit(self, request, *, takes: int = 1, seed: int = 0, first_take: int = 0, params=None,
                     chunk_frames: int = 8, first_chunk_frames: int = 0) -> RayTicket:
        if self._open >= self.capacity:
            raise QueueFullError(f"every engine replica is busy and {self.max_queue} requests wait already (the "
                                 "server's --max-queue); try again shortly.")
        options = {"takes": takes, "seed": seed, "first_take": first_take, "params": params,
                   "chunk_frames": chunk_frames, "first_chunk_frames": first_chunk_frames}
        try:
            response = self._stream.stream.remote(request, options)
        except Exception as exc:  # noqa: BLE001 - re-raised, Ray's wrapper taken off
            raise unwrapped(exc) from None
        return RayTicket(response, self)

    async def extract_voice(self, waveform, sample_rate: int, ref_text: str | None):
        """Extracted on a replica (the front loads no engine); the voice comes back as CPU tensors."""
        try:
            return await self.handle.extract_voice.remote(np.asarray(waveform, np.float32), sample_rate, ref_text)
        except Exception as exc:  # noqa: BLE001 - each is re-raised, Ray's wrapper taken off
            raise unwrapped(exc) from None

    def stats(self) -> dict:
        """Requests sent without audio back yet (waiting: in Ray Serve's queue or a replica's), requests whose
        audio flows (running), and the replicas' rows in use (as /health last read them) of all their slots."""
        return {"waiting": self._waiting, "running": self._open - self._waiting,
                "rows": sum(r.get("rows", 0) for r in self._each), "slots": self.replica_count * self.rows}

    async def replicas(self) -> dict:
        """The replica count and each replica's waiting / running requests, rows in use and requests served,
        as last posted to the stats board (a replica silent for a few seconds is left out)."""
        out = {"count": self.replica_count}
        if self.board is None:
            return out
        try:
            out["each"] = self._each = await asyncio.wait_for(
                asyncio.wrap_future(self.board.read.remote().future()), HEALTH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - /health still answers; the replica list is what is missing
            log.warning("the replicas' stats did not come: %s", exc)
        return out

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None
