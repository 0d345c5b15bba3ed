"""The caller's callbacks of generate() and stream(): on_progress(done, total) and should_stop().

They are checked before any work (None or callable). One that raises ends the call with its own exception,
unchanged in type so that a front end's own signal (ComfyUI's interrupt, raised from on_progress) still
means what it meant, but with a note naming the callback; the engine's lock and state are released by the
call's own cleanup, so the next call runs as if this one had not happened.
"""
from __future__ import annotations

from collections.abc import Callable

from .errors import InvalidInputError

NAMES = ("on_progress", "should_stop")


def guarded(name: str, fn: Callable | None) -> Callable | None:
    """`fn` checked (None or callable) and wrapped so that an exception it raises says where it came from."""
    if fn is None:
        return None
    if not callable(fn):
        raise InvalidInputError(f"{name} must be a function or None (got {type(fn).__name__}); "
                                + ("it is called as on_progress(frames_done, frames_total)." if name == "on_progress"
                                   else "it is called as should_stop() and returns True to stop."))

    def call(*args):
        try:
            out = fn(*args)
            return bool(out) if name == "should_stop" else out  # its truth value is the callback's answer too
        except Exception as exc:
            exc.add_note(f"raised by the {name} callback; the call was stopped and the engine is ready for the "
                         "next call.")
            raise
    return call
