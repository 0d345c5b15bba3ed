"""One caller at a time per engine: the runner's KV cache, static buffers, CUDA graphs and codec state are
shared by every call, so two interleaved calls would corrupt each other's audio.

* A call from another thread waits until the engine is free (at most `Engine.busy_timeout_s`), then runs;
  if the engine stays busy that long it gets `EngineBusyError` naming the holder.
* A `stream()` generator holds the engine from its first `next()` until it is
  exhausted, closed or garbage-collected. A caller that abandons one without `close()` keeps the engine busy while it still
  references the generator (CPython closes an unreferenced generator at once).
* A call from the thread that already holds the engine (a callback of a running call, or a second call
  while this thread's stream generator is unfinished) would deadlock or overwrite the running call's state,
  so it raises `EngineBusyError` at once. Only a holder declared `nests=True` lets its own thread
  in (no engine call is declared so today: generate decodes a list of items itself).
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

from .errors import EngineBusyError


@dataclass
class _Hold:
    what: str
    thread: int
    thread_name: str
    nests: bool


class EngineLock:
    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._holds: list[_Hold] = []  # outermost first; all of one thread

    def acquire(self, what: str, timeout: float | None, nests: bool = False) -> _Hold:
        me = threading.current_thread()
        with self._cond:
            if self._holds and self._holds[0].thread == me.ident:
                top = self._holds[-1]
                if not top.nests:
                    raise EngineBusyError(
                        f"{what}() was called while this thread's {top.what}() is still running on the same "
                        "engine (from one of its callbacks, or while its stream generator is unfinished); "
                        "finish or close() the first call before starting another.")
            else:
                deadline = None if timeout is None else time.monotonic() + timeout
                while self._holds:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        h = self._holds[0]
                        raise EngineBusyError(
                            f"{what}() waited {timeout:.0f} s but the engine is still busy with {h.what}() of "
                            f"thread '{h.thread_name}' (an unfinished stream generator keeps it busy until it is "
                            "exhausted or closed); try again later or load a second engine for this thread.")
                    self._cond.wait(left)
            hold = _Hold(what, me.ident, me.name, nests)
            self._holds.append(hold)
            return hold

    def release(self, hold: _Hold) -> None:
        with self._cond:
            self._holds.remove(hold)  # may run in another thread (a generator closed there)
            if not self._holds:
                self._cond.notify_all()

    @property
    def busy(self) -> bool:
        with self._cond:
            return bool(self._holds)


def serialised(nests: bool = False):
    """Method decorator: run the call holding the engine's lock."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            hold = self._lock.acquire(fn.__name__, self.busy_timeout_s, nests)
            try:
                return fn(self, *args, **kwargs)
            finally:
                self._lock.release(hold)
        return call
    return wrap


def serialised_stream(fn):
    """Generator-method decorator: hold the engine's lock for the generator's whole life."""
    @functools.wraps(fn)
    def gen(self, *args, **kwargs):
        hold = self._lock.acquire(fn.__name__, self.busy_timeout_s)
        try:
            yield from fn(self, *args, **kwargs)
        finally:
            self._lock.release(hold)
    return gen
