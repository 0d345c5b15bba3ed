"""The server's one door into the engine: the engine's scheduler (engine/scheduler.py), seen from an event loop.

Every request joins the one open decode loop at its next chunk boundary, so requests that arrive together are
decoded together, each exactly as it would be alone. `submit` checks the request and builds its prompt in a
worker thread (the event loop never waits on the tokenizer) and returns a `Served`: the request's chunks,
`async for`, with `cancel()`. A full queue is `QueueFullError` (the server's 503).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..errors import GenerationInterrupted, QueueFullError
from ..scheduler import Scheduler


@dataclass
class Counts:
    """What the backend has done since it started (shown by /health)."""

    completed: int = 0
    cancelled: int = 0  # stopped early because the client left or cancelled
    failed: int = 0


class Served:
    """One request's chunks as the engine makes them: `async for chunk in served`. The request's error is raised
    by the iteration. `cancel()` frees its rows at the loop's next boundary; safe at any time, also after the end."""

    def __init__(self, ticket, counts: Counts):
        self.ticket = ticket
        self._counts = counts
        self._outcome: str | None = None

    def _end(self, outcome: str) -> None:
        if self._outcome is None:
            self._outcome = outcome
            setattr(self._counts, outcome, getattr(self._counts, outcome) + 1)

    def cancel(self) -> None:
        if self._outcome is None and not self.ticket.done:
            self.ticket.cancel()
            self._end("cancelled")

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.ticket.__anext__()
        except StopAsyncIteration:
            self._end("completed")
            raise
        except GenerationInterrupted:
            self._end("cancelled")
            raise StopAsyncIteration from None
        except Exception:
            self._end("failed")
            raise


class Backend:
    def __init__(self, engine, max_queue: int = 16, max_rows: int | None = None, boundary_frames: int = 2):
        self.engine = engine
        self.counts = Counts()
        self.scheduler = Scheduler(engine, max_rows=max_rows, max_queue=max_queue, chunk_frames=boundary_frames)

    async def submit(self, request, *, takes: int = 1, seed: int = 0, first_take: int = 0, params=None,
                     chunk_frames: int = 8, first_chunk_frames: int = 0) -> Served:
        """Queue one request (its errors raise here); the result yields the engine's Chunks as they are made."""
        try:
            ticket = await self.scheduler.submit_async(request, takes=takes, seed=seed, first_take=first_take,
                                                       params=params, chunk_frames=chunk_frames,
                                                       first_chunk_frames=first_chunk_frames)
        except asyncio.CancelledError:  # the client left while its request was queued: the scheduler cancels it
            self.counts.cancelled += 1
            raise
        except QueueFullError:
            raise QueueFullError(f"the server already has {self.max_queue} requests waiting (its "
                                 "--max-queue); try again shortly.") from None
        return Served(ticket, self.counts)

    async def extract_voice(self, waveform, sample_rate: int, ref_text: str | None):
        """A voice from uploaded audio. It uses the speaker and codec encoders only, so it runs beside the loop."""
        return await self.scheduler.run_beside(self.engine.extract_voice_beside_decode, waveform, sample_rate,
                                               ref_text)

    @property
    def max_queue(self) -> int:
        return self.scheduler.max_queue

    def stats(self) -> dict:
        return self.scheduler.stats()

    def close(self, timeout: float = 10.0) -> None:
        """End every queued and running request and stop the loop; the engine is free again."""
        self.scheduler.close(timeout)
