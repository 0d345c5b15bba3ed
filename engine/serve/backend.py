"""The server's one door into the engine: submit a request, get a Ticket of its audio chunks, cancel it.

This backend runs requests one after another through `Engine.stream`, in one worker thread, first come first
served, from a bounded queue: the engine decodes one caller at a time, and closing a stream frees it at once.
An engine scheduler that batches requests across rows offers the same shape (`submit(request, takes=, seed=,
first_take=, params=, chunk_frames=, first_chunk_frames=) -> Ticket`, a Ticket async-iterable over the engine's
`Chunk`s with `cancel()`, `QueueFullError` past its queue), so serving through it changes this file alone.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from ..errors import GenerationInterrupted, QueueFullError

log = logging.getLogger(__name__)

_END = object()  # the last item of every Ticket


class Ticket:
    """One request's results, in order: `async for chunk in ticket`. An error of the request is raised by the
    iteration. `cancel()` stops the request at its next chunk boundary (or before it starts) and frees the engine;
    it is safe to call at any time, also after the end."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self._done = False

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        item = await self._items.get()
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def _put(self, item) -> None:
        """Hand an item to the event loop (called from the worker thread)."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel()


@dataclass
class Counts:
    """What the backend has done since it started (shown by /health)."""

    completed: int = 0
    cancelled: int = 0  # stopped early because the client left or cancelled
    failed: int = 0


class Backend:
    def __init__(self, engine, max_queue: int = 16):
        self.engine = engine
        self.max_queue = max_queue
        self.counts = Counts()
        self._jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self._current: Ticket | None = None
        self._thread = threading.Thread(target=self._work, name="speech-backend", daemon=True)
        self._thread.start()

    # -- the event loop's side -------------------------------------------------------------------

    def submit(self, request, *, takes: int = 1, seed: int = 0, first_take: int = 0, params=None,
               chunk_frames: int = 8, first_chunk_frames: int = 0) -> Ticket:
        """Queue one request; its Ticket yields the engine's Chunks as they are made. Call from the event loop."""
        ticket = Ticket(asyncio.get_running_loop())
        kwargs = {"takes": takes, "seed": seed, "first_take": first_take, "params": params,
                  "chunk_frames": chunk_frames, "first_chunk_frames": first_chunk_frames}
        self._enqueue(ticket, lambda: self._stream(ticket, request, kwargs))
        return ticket

    async def extract_voice(self, waveform, sample_rate: int, ref_text: str | None):
        """engine.extract_voice, queued with the requests, since it uses the engine too."""
        ticket = Ticket(asyncio.get_running_loop())
        self._enqueue(ticket, lambda: self._call(ticket, self.engine.extract_voice, waveform, sample_rate,
                                                 ref_text=ref_text))
        try:
            return await ticket.__anext__()
        finally:
            ticket.cancel()

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    @property
    def busy(self) -> bool:
        return self._current is not None

    def close(self, timeout: float = 10.0) -> None:
        """Cancel the running request and stop the worker; queued requests end without audio."""
        if self._current is not None:
            self._current.cancel()
        while True:
            try:
                ticket, _ = self._jobs.get_nowait()
            except queue.Empty:
                break
            ticket.cancel()
            ticket._put(_END)
        self._jobs.put((None, None))
        self._thread.join(timeout)

    def _enqueue(self, ticket: Ticket, job) -> None:
        try:
            self._jobs.put_nowait((ticket, job))
        except queue.Full:
            raise QueueFullError(f"the server already has {self.max_queue} requests waiting (its --max-queue); "
                                 "try again shortly.") from None

    # -- the worker thread's side ----------------------------------------------------------------

    def _work(self) -> None:
        device = getattr(self.engine, "device", None)
        if device is not None and device.type == "cuda":
            import torch

            # The current CUDA device is per thread, and a capture uses it: make it the engine's here too.
            torch.cuda.set_device(device)
        while True:
            ticket, job = self._jobs.get()
            if ticket is None:
                return
            if ticket.cancelled:  # the client left while the request waited: the engine never sees it
                self.counts.cancelled += 1
                ticket._put(_END)
                continue
            self._current = ticket
            try:
                job()  # a job hands its own errors to its ticket; this catches a failure of that hand-over
            except Exception as exc:  # a request's failure must never end the worker
                log.exception("request failed in the backend")
                ticket._put(exc)
                ticket._put(_END)
            finally:
                self._current = None

    def _stream(self, ticket: Ticket, request, kwargs: dict) -> None:
        chunks = self.engine.stream(request, should_stop=lambda: ticket.cancelled, **kwargs)
        outcome = "cancelled"
        try:
            for chunk in chunks:
                if ticket.cancelled:
                    break
                ticket._put(chunk)
            else:
                outcome = "completed"
        except GenerationInterrupted:
            pass  # should_stop saw the cancel inside a chunk
        except Exception as exc:  # noqa: BLE001  any failure is the request's, handed to its client
            outcome = "failed"
            ticket._put(exc)
        finally:
            chunks.close()  # frees the engine now, not when the generator is collected
            setattr(self.counts, outcome, getattr(self.counts, outcome) + 1)
            ticket._put(_END)

    def _call(self, ticket: Ticket, fn, *args, **kwargs) -> None:
        try:
            ticket._put(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001  any failure is the request's, handed to its client
            self.counts.failed += 1
            ticket._put(exc)
        ticket._put(_END)
