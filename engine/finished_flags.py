"""The runner's finished flags of a chunk, read on the host without holding up the frames queued after it
(the decode loop's `ahead` frames, engine/decode.py)."""
from __future__ import annotations

import torch


class FinishedFlags:
    """The runner's finished flags of a chunk's last frame, read on the host after the next frame has been
    launched. CUDA: an async copy into one pinned buffer and an event, both queued before that frame (which
    updates the flags again); elsewhere a copy taken before it."""

    def __init__(self, runner, device):
        self.runner, self.cuda = runner, device.type == "cuda"
        self.flags = torch.empty(runner.finished.shape, dtype=torch.bool, pin_memory=True) if self.cuda else None
        self.copied = None  # CUDA: the event after the copy into `flags`

    def snapshot(self):
        """Take the flags as they are after the frames queued so far; returns the CUDA event that marks
        that point on the stream (None elsewhere)."""
        if not self.cuda:
            self.flags = self.runner.finished.clone()
            return None
        self.flags.copy_(self.runner.finished, non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return self.copied

    def read(self) -> list:
        if self.copied is not None:
            self.copied.synchronize()
        return self.flags.tolist()
