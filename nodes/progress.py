"""One progress bar, counted in codec frames, over several text segments (pure Python).

The engine reports `(frames_done, frames_total)` per segment. Segments not started yet are assumed
to be as long as the current one, so the bar's maximum is an estimate that firms up as segments finish.
"""
from __future__ import annotations

from typing import Callable


class SegmentProgress:
    def __init__(self, n_segments: int, report: Callable[[int, int], None]):
        self.n = max(1, n_segments)
        self.report = report  # report(value, maximum), both in frames
        self.done = 0  # frames of finished segments
        self.k = 0  # index of the current segment
        self.cur_done = 0
        self.cur_total = 0

    def on_progress(self, frames_done: int, frames_total: int) -> None:
        self.cur_done, self.cur_total = int(frames_done), max(int(frames_total), int(frames_done), 1)
        remaining = self.n - self.k - 1
        maximum = self.done + self.cur_total * (1 + remaining)
        self.report(self.done + self.cur_done, maximum)

    def next_segment(self) -> None:
        """Mark the current segment finished (its real frame count becomes final)."""
        self.done += self.cur_done
        self.k += 1
        self.cur_done = 0
