"""Where the decode loop (engine/decode.py) takes its rows from, at each chunk boundary.

A source has `rows` (row id -> decode.Row), `waiting()` (rows wait for a slot), `queued()` (their ids, for the
progress estimate), `take(free)` (the ids of the next rows to admit together, one prompt's takes, into at most
`free` slots; [] when none is to be admitted now), `dropped()` (ids of held rows their caller gave up: they end
at this boundary), `max_len` (cache positions a row may need), `device` and `refills(slots)` (whether a slot may be
admitted twice in one loop). `FixedRows` is a call's list of rows; the scheduler's source (engine/scheduler)
grows while the loop runs.
"""
from __future__ import annotations

from collections import deque


class FixedRows:
    """The rows of one call, admitted in `order` (default: their order); consecutive rows of one prompt, budget
    and sampling (an item's takes) share one prefill, and fill whatever slots are free."""

    def __init__(self, rows: list, order=None):
        self.rows = rows
        self.queue = deque(range(len(rows)) if order is None else order)
        self.max_len = max(r.prompt.prefill.shape[1] + r.max_frames for r in rows)
        self.device = rows[0].prompt.prefill.device

    def refills(self, slots: int) -> bool:
        return len(self.rows) > slots

    def waiting(self) -> bool:
        return bool(self.queue)

    def queued(self):
        return self.queue

    def take(self, free: int) -> list:
        group, rows, queue = [], self.rows, self.queue
        while len(group) < free and queue:
            row, first = rows[queue[0]], rows[group[0]] if group else None
            if first is not None and (row.prompt is not first.prompt or row.max_frames != first.max_frames
                                      or row.params != first.params):
                break
            group.append(queue.popleft())
        return group

    def dropped(self) -> tuple:
        return ()
