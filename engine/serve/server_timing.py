"""Server-Timing (the W3C header): how long a speech request spent in each of the handler's steps before its
response's headers went out, so a client can tell the server's time from the network's and its own.

    Server-Timing: parse;dur=0.31, submit;dur=1.92, audio;dur=9.75

`parse`: reading and checking the body (with an uploaded reference, also extracting its voice); `submit`: until the
engine has checked the request, built its prompt and queued it; `audio`: from then until the first chunk (streamed)
or all the audio (whole) reached the handler. Milliseconds, as the header's `dur` is.
"""
from __future__ import annotations

import time


class StepTimes:
    """The handler's steps, each marked as it ends."""

    def __init__(self):
        self._last = time.perf_counter()
        self.steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        now = time.perf_counter()
        self.steps.append((step, now - self._last))
        self._last = now

    def header(self) -> dict:
        return {"Server-Timing": ", ".join(f"{step};dur={1000 * s:.2f}" for step, s in self.steps)}


def parse_header(value: str | None) -> dict:
    """{step: ms} of a Server-Timing header (a client's reading; {} without one)."""
    out = {}
    for part in (value or "").split(","):
        name, _, rest = part.strip().partition(";")
        for param in rest.split(";"):
            key, _, ms = param.strip().partition("=")
            if name and key == "dur":
                out[name] = float(ms)
    return out
