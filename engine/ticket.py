"""A Ticket: the chunk stream of one request submitted to the scheduler (engine/scheduler.py).

The scheduler's thread puts each take's audio into the ticket as the decode loop makes it; any number of
consumers take the chunks out, blocking (`for chunk in ticket`) or from an asyncio event loop
(`async for chunk in ticket`), in the order each take's chunks were made. The stream ends after every take's
final chunk, or raises the error that ended the request: `GenerationInterrupted` once it was cancelled,
`SchedulerClosedError` when the scheduler closed first, or whatever error stopped the decode loop.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

import torch

from .engine import Chunk
from .errors import GenerationInterrupted

_END = object()  # every take's final chunk has been taken


class Ticket:
    """`takes` takes of one request; chunk.item is always 0, chunk.take the take's index (random stream
    first_take + take), chunk.elapsed_s the seconds since submit. `admitted_at` is the scheduler's chunk
    boundary at which the request's rows joined the loop (None while it waits) and `admitted_s` the seconds from
    submit to then, `cancelled_at` the boundary count when it was cancelled (its rows leave at the next one)."""

    def __init__(self, takes: int, chunk_frames: int, cancel_hook, t0: float | None = None):
        self.takes = takes
        self.admitted_at = self.admitted_s = self.cancelled_at = None
        self._chunk_frames = chunk_frames  # the most frames a chunk gathers from the loop's chunks
        self._cancel_hook = cancel_hook  # tells the scheduler: free this ticket's rows
        self._t0 = time.perf_counter() if t0 is None else t0  # when the request was submitted
        self._cond = threading.Condition()
        self._ready: deque = deque()
        self._open_takes = takes
        self._error: BaseException | None = None
        self._waiters: list = []  # (event loop, future) of async consumers waiting for the next chunk
        self._gathered = [[] for _ in range(takes)]  # a take's (audio, codes) not handed out yet
        self._count = [0] * takes
        self._last = [0] * takes  # frames of the take's last chunk handed out

    # -- the consumer's side -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """No chunk will be added any more (finished, failed or cancelled)."""
        with self._cond:
            return self._open_takes == 0 or self._error is not None

    @property
    def cancelled(self) -> bool:
        with self._cond:
            return isinstance(self._error, GenerationInterrupted)

    def cancel(self) -> None:
        """Give the request up: its rows are freed at the loop's next chunk boundary (a request still waiting
        leaves the queue at once), chunks not yet taken are dropped, and taking the next raises
        GenerationInterrupted. Nothing happens once every take has ended."""
        with self._cond:
            if self._open_takes == 0 or self._error is not None:
                return
            self._error = GenerationInterrupted("this request was cancelled; submit it again to hear it.")
            self._ready.clear()
            self._wake()
        self._cancel_hook(self)

    def _next(self):
        """The next chunk, _END, or None when none is ready yet (call holding the lock)."""
        if self._ready:
            return self._ready.popleft()
        if self._error is not None:
            raise self._error
        return _END if self._open_takes == 0 else None

    def __iter__(self):
        return self

    def __next__(self) -> Chunk:
        with self._cond:
            while (item := self._next()) is None:
                self._cond.wait()
        if item is _END:
            raise StopIteration
        return item

    def __aiter__(self):
        return self

    async def __anext__(self) -> Chunk:
        while True:
            with self._cond:
                item = self._next()
                if item is None:
                    loop = asyncio.get_running_loop()
                    waiter = loop.create_future()
                    self._waiters.append((loop, waiter))
            if item is _END:
                raise StopAsyncIteration
            if item is not None:
                return item
            await waiter

    # -- the scheduler's side ------------------------------------------------------------------------

    def _wake(self) -> None:
        self._cond.notify_all()
        for loop, waiter in self._waiters:
            try:
                loop.call_soon_threadsafe(_resolve, waiter)
            except RuntimeError:  # that event loop is closed: nobody waits there any more
                pass
        self._waiters.clear()

    def _put(self, take: int, audio: torch.Tensor, codes: torch.Tensor, final: bool) -> None:
        """Take `take`'s next audio and codes from the loop. A take's first chunk goes out at once (first audio);
        each later one gathers twice the frames of the one before, up to chunk_frames (1, 2, 4, 8, 8, ... after
        a one-frame first chunk), so the listener holds more audio than the next chunk takes to make; the end
        goes out at once."""
        gathered = self._gathered[take]
        gathered.append((audio, codes))
        want = min(self._chunk_frames, max(1, 2 * self._last[take]))
        if not final and self._count[take] > 0 and sum(c.shape[0] for _, c in gathered) < want:
            return
        audio = torch.cat([a for a, _ in gathered]) if len(gathered) > 1 else audio
        codes = torch.cat([c for _, c in gathered]) if len(gathered) > 1 else codes
        gathered.clear()
        with self._cond:
            if self._error is not None:  # cancelled or failed: nobody takes it
                return
            self._ready.append(Chunk(item=0, take=take, audio=audio, codes=codes, index=self._count[take],
                                     final=final, elapsed_s=time.perf_counter() - self._t0))
            self._count[take] += 1
            self._last[take] = codes.shape[0]
            if final:
                self._open_takes -= 1
            self._wake()

    def _fail(self, error: BaseException) -> None:
        """End the request with `error` (unless it has ended already); the chunks ready are still handed out."""
        with self._cond:
            if self._open_takes == 0 or self._error is not None:
                return
            self._error = error
            self._wake()


def _resolve(waiter) -> None:
    if not waiter.done():
        waiter.set_result(None)
