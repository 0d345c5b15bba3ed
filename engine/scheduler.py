"""The scheduler: many requests, from any number of threads, served by one open decode loop on one engine.

`Scheduler(engine)` owns one thread. While requests wait or run, that thread holds the engine (engine_lock.py)
and runs the engine's one decode loop (decode.py) over a row source that grows: a submitted request's takes
join free slots at the loop's next chunk boundary, each at its own position, with its own sampling settings,
and leave when they end or are cancelled. Between requests the engine is free, so direct generate() and
stream() calls still run (and the scheduler waits for them).

* First come, first served: requests are admitted in submission order, a request's takes together (one
  prefill). A request whose takes do not fit the free slots waits at the head, and no later request passes
  it, so none starves.
* Back-pressure: at most `max_queue` requests wait for rows; past that, submit() raises QueueFullError.
* A request's takes draw from the random streams (seed, first_take + i) and every row decodes as it would
  alone, so a request served under load equals Engine.generate of the same request with the same seed.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch

from . import checks, sampling
from .decode import Row, decode_rows
from .engine import STREAM_AHEAD, BatchItem
from .errors import (
    EngineBusyError,
    InvalidInputError,
    QueueFullError,
    SchedulerClosedError,
)
from .prompt import Request, expected_frames
from .sampling import MAX_NEW_TOKENS
from .ticket import Ticket

MAX_QUEUE = 1 << 16  # a sanity limit for max_queue

log = logging.getLogger(__name__)


class Scheduler:
    """Serve submitted requests on `engine` in one decode loop of `max_rows` rows (default the engine's
    max_takes), with chunk boundaries every `chunk_frames` frames (where requests join and cancelled ones
    leave). Use submit() from any thread, close() when done (or `with Scheduler(engine) as s:`)."""

    def __init__(self, engine, *, max_rows: int | None = None, max_queue: int = 64, chunk_frames: int = 8):
        self.engine = engine
        self.slots = engine._max_rows(max_rows)
        self.max_queue = checks.whole_number("max_queue", max_queue, 1, MAX_QUEUE)
        self.chunk_frames = checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS,
                                                "8 frames (0.64 s) is typical.")
        self._cond = threading.Condition()
        self._waiting: deque = deque()  # tickets whose rows wait for slots, in submission order
        self._rows: dict = {}  # row id -> decode Row, for every waiting or running request
        self._refs: dict = {}  # row id -> its ICL reference codes (the codec session's left context)
        self._owner: dict = {}  # row id -> (ticket, take)
        self._live: dict = {}  # ticket -> ids of its rows that have not ended
        self._dropped: set = set()  # rows of cancelled running tickets, to end at the next boundary
        self._next_row = 0
        self._boundary = 0  # chunk boundaries the loop has passed (Ticket.admitted_at counts in these)
        self._closed = False
        self._source = _OpenRows(self)
        # Threads of their own for the work callers hand over from an event loop: on a GPU every thread that runs
        # a matmul keeps a cuBLAS workspace (32 MiB on Hopper) for the life of the process, so the event loop's
        # default pool, which starts threads as it needs them, grew the memory request after request.
        self._prompts = ThreadPoolExecutor(1, thread_name_prefix="qwen3tts-prompts")  # submit_async
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="qwen3tts-beside")  # run_beside
        self._precapture()
        self._thread = threading.Thread(target=self._run, name="qwen3tts-scheduler", daemon=True)
        self._thread.start()

    def _precapture(self) -> None:
        """The codec graphs this loop decodes its rows with, captured now (holding the engine) rather than
        before the first request's first frame."""
        if self.engine.codec_graphs is None:
            return
        hold = self.engine._lock.acquire("Scheduler", self.engine.busy_timeout_s)
        try:
            self.engine.codec_graphs.precapture_slots(self.slots)
        finally:
            self.engine._lock.release(hold)

    # -- the callers' side --------------------------------------------------------------------------

    def submit(self, what: Request | BatchItem, *, takes: int = 1, seed: int = 0, first_take: int = 0,
               params=None, chunk_frames: int | None = None, first_chunk_frames: int = 0) -> Ticket:
        """Queue one request (a Request, or a BatchItem carrying its takes, seed, first_take and frame budget)
        and return its Ticket at once. The request is checked and its prompt built here, so a bad request
        raises its error from submit(). `chunk_frames` (None: the scheduler's) is the most frames a chunk
        gathers from the loop's chunks: after the first, each chunk gathers twice the frames of the one before,
        up to it (Ticket._put); `first_chunk_frames` (1..the scheduler's chunk_frames,
        0 = off) shortens the loop's chunk after the request joins, for earlier first audio.
        Raises QueueFullError when max_queue requests wait already, SchedulerClosedError after close()."""
        t0, max_new_tokens = time.perf_counter(), None
        if checks.same_kind(what, BatchItem):
            if (takes, seed, first_take) != (1, 0, 0):
                raise InvalidInputError("submit: with a BatchItem, takes, seed and first_take are set on the item.")
            what, takes, seed, first_take, max_new_tokens = (what.request, what.takes, what.seed, what.first_take,
                                                             what.max_new_tokens)
        checks.whole_number("takes", takes, 1, self.slots, f"This scheduler runs {self.slots} rows at once; "
                            "submit fewer takes, or create it with a larger max_rows.")
        gather = self.chunk_frames if chunk_frames is None else \
            checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
        checks.whole_number("first_chunk_frames", first_chunk_frames, 0, self.chunk_frames,
                            "0 makes the first chunk as long as the others; 2 gives the earliest first audio.")
        self._check_room()
        with torch.inference_mode():
            prompt, params, max_frames = self.engine.prepare(what, takes, params, first_take, max_new_tokens, seed)
        keys = sampling.take_keys(seed, range(first_take, first_take + takes), "cpu").tolist()
        guess = min(max_frames, expected_frames(what.text))
        ticket = Ticket(takes, gather, self._cancel, t0)
        with self._cond:
            self._check_room()
            ids = list(range(self._next_row, self._next_row + takes))
            self._next_row += takes
            for take, (row, key) in enumerate(zip(ids, keys)):
                self._rows[row] = Row(prompt, key, max_frames, guess, params=params, first_chunk=first_chunk_frames)
                self._refs[row] = prompt.ref_codes
                self._owner[row] = (ticket, take)
            self._live[ticket] = set(ids)
            self._waiting.append(ticket)
            self._cond.notify_all()
        return ticket

    async def submit_async(self, what: Request | BatchItem, **options) -> Ticket:
        """submit() from an asyncio event loop: it runs in a worker thread (it tokenizes and builds the prompt,
        while the loop carries other requests' chunks), and a caller cancelled meanwhile still gets its ticket
        cancelled as it arrives, so no rows decode for nobody. A `first_chunk_frames` above this scheduler's
        chunk_frames is lowered to it."""
        first = options.get("first_chunk_frames", 0)
        options["first_chunk_frames"] = min(first, self.chunk_frames)
        work = self._hand_over(self._prompts, functools.partial(self.submit, what, **options))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(_cancel_on_arrival)
            raise

    async def run_beside(self, fn, *args):
        """fn(*args) from an asyncio event loop, in this scheduler's worker thread for engine work that runs beside
        the decode loop (Engine.extract_voice_beside_decode): one thread, so one cuBLAS workspace."""
        return await self._hand_over(self._beside, functools.partial(fn, *args))

    def _hand_over(self, pool: ThreadPoolExecutor, call) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the pool was shut down by close() meanwhile
                return loop.run_in_executor(pool, call)
        raise SchedulerClosedError("this scheduler was closed; create a new Scheduler to submit requests.")

    def _check_room(self) -> None:
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("this scheduler was closed; create a new Scheduler to submit requests.")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"{len(self._waiting)} requests already wait for rows (max_queue "
                                     f"{self.max_queue}); retry later, or create the Scheduler with a larger "
                                     "max_queue.")

    def stats(self) -> dict:
        """waiting / running requests, rows held by running requests, slots, and chunk boundaries so far."""
        with self._cond:
            running = [t for t in self._live if t not in self._waiting]
            return {"waiting": len(self._waiting), "running": len(running),
                    "rows": sum(len(self._live[t]) for t in running), "slots": self.slots,
                    "boundaries": self._boundary}

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop: the loop ends within a frame, every queued or running request ends with
        SchedulerClosedError, submit() refuses, and the engine is free again."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._end_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _cancel(self, ticket: Ticket) -> None:
        """A ticket was cancelled: out of the queue now, or its rows end at the loop's next boundary."""
        with self._cond:
            ticket.cancelled_at = self._boundary
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                self._forget(ticket)
            elif ticket in self._live:
                self._dropped.update(self._live[ticket])

    # -- the loop's side ----------------------------------------------------------------------------

    def _forget(self, ticket: Ticket, rows=None) -> None:
        """Drop the bookkeeping of `ticket`'s `rows` (default all); the ticket once none is left (holding _cond)."""
        live = self._live.get(ticket, set())
        for row in list(live if rows is None else rows):
            live.discard(row)
            for table in (self._rows, self._refs, self._owner):
                table.pop(row, None)
        if not live:
            self._live.pop(ticket, None)

    def _fail_all(self, tickets: list, error: BaseException | None = None) -> None:
        with self._cond:
            for ticket in tickets:
                if ticket in self._waiting:
                    self._waiting.remove(ticket)
                self._forget(ticket)
        for ticket in tickets:
            ticket._fail(error or SchedulerClosedError("the scheduler was closed before this request ended; "
                                                       "submit it to a new Scheduler."))

    def _run(self) -> None:
        """The loop's thread. Should anything escape the loop itself, the scheduler closes with it: every
        request ends with that error and submit() refuses, instead of waiting on a thread that is gone."""
        try:
            self._loop()
        except BaseException as error:  # noqa: BLE001 - logged, and every request ends with it
            log.exception("the scheduler's loop stopped")
            with self._cond:
                self._closed = True
            self._end_all(SchedulerClosedError(
                f"the scheduler stopped ({type(error).__name__}: {error}); create a new Scheduler."))

    def _end_all(self, error: BaseException | None = None) -> None:
        """Once closed: every request left ends with `error` (default: closed), and the worker threads go."""
        self._fail_all(list(self._live), error)
        for pool in (self._prompts, self._beside):
            pool.shutdown(wait=False)

    def _loop(self) -> None:
        engine = self.engine
        if engine.device.type == "cuda":
            torch.cuda.set_device(engine.device)  # the current device is per thread
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            hold = self._hold_engine()
            if hold is None:
                return
            try:
                with torch.inference_mode():
                    self._serve()
            except Exception as error:  # noqa: BLE001 - the loop's requests end with it; the scheduler goes on
                with self._cond:
                    running = [t for t in self._live if t not in self._waiting]
                    self._dropped.clear()
                self._fail_all(running, None if self._closed else error)
            finally:
                engine._lock.release(hold)

    def _hold_engine(self):
        """Wait for the engine (a direct call may hold it); None once closed."""
        while not self._closed:
            try:
                return self.engine._lock.acquire("scheduler", 0.2)
            except EngineBusyError:
                continue
        return None

    def _serve(self) -> None:
        """One decode loop, until no request waits or runs."""
        engine = self.engine
        session = engine._session(self._refs, together=False, stream=True, slots=self.slots)
        side = session.side
        chunks = decode_rows(engine.runner, self._source, slots=self.slots, params=engine.defaults,
                             eos_id=engine.cfg.talker.codec_eos_id, chunk_frames=self.chunk_frames,
                             should_stop=lambda: self._closed, prelaunch=side is not None,
                             ahead=STREAM_AHEAD if side is not None else 0, on_admit=session.admit)
        try:
            for chunk in chunks:
                for row, audio, codes, final in session.push(chunk):
                    ticket, take = self._owner[row]
                    ticket._put(take, audio, codes, final)
                with self._cond:
                    for row in chunk.ended:
                        self._forget(self._owner[row][0], [row])
        finally:
            chunks.close()  # the loop first, then the codec states it fed
            session.release()


class _OpenRows:
    """The decode loop's row source (engine/row_source.py) over the scheduler's queue; called by the loop."""

    def __init__(self, scheduler: Scheduler):
        self.s = scheduler
        self.rows = scheduler._rows
        self.device = scheduler.engine.device
        self.max_len = scheduler.engine.config.max_seq_len  # any request may join: the whole cache

    def refills(self, slots: int) -> bool:
        return True

    def waiting(self) -> bool:
        with self.s._cond:
            return bool(self.s._waiting)

    def queued(self) -> list:
        with self.s._cond:
            return [row for t in self.s._waiting for row in self.s._live[t]]

    def take(self, free: int) -> list:
        """The head request's rows when they all fit; else none (nothing overtakes the head)."""
        s = self.s
        with s._cond:
            if not s._waiting or len(s._live[s._waiting[0]]) > free:
                return []
            ticket = s._waiting.popleft()
            ticket.admitted_at, ticket.admitted_s = s._boundary, time.perf_counter() - ticket._t0
            return sorted(s._live[ticket])

    def dropped(self) -> set:
        s = self.s
        with s._cond:
            s._boundary += 1
            out, s._dropped = s._dropped, set()
            return out


def _cancel_on_arrival(work) -> None:
    if not work.cancelled() and work.exception() is None:
        work.result().cancel()
