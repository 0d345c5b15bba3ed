"""Host memory for a request's audio, made resident while the frames are decoded instead of after them.

A request's audio reaches the host in one copy at its end. Into new memory that copy is slow: the kernel
hands out each 4 KB page on its first write, ~0.3-0.5 ms per MB, so the 11 MB of a 4-take, 28 s line cost
7-12 ms after the last frame where 2-4 ms would do (docs/PERFORMANCE_NOTES.md). Here the request reserves
room for its whole frame budget up front (an anonymous mapping: untouched pages cost nothing), touches the
pages of the frames decoded so far after each chunk, while the host would only wait for the GPU, and at the
end views the first rows x length samples as one contiguous [rows, length] tensor: the copy lands in pages
that are already there. The layout needs only the final length, so takes that end by EOS lose nothing.
"""
from __future__ import annotations

import ctypes
import mmap

import torch

from .config import SAMPLES_PER_FRAME

PAGE = mmap.PAGESIZE


class HostAudio:
    """Room for `rows` x `max_frames` frames of float32 audio; `touch(frames)` after each chunk, then `take`."""

    def __init__(self, rows: int, max_frames: int):
        self.rows = rows
        self.size = max(PAGE, 4 * rows * max_frames * SAMPLES_PER_FRAME)
        self.map = mmap.mmap(-1, self.size)  # freed with the last tensor that views it
        self.flat = torch.frombuffer(self.map, dtype=torch.float32)
        self.touched = 0  # bytes from the start known to be resident

    def touch(self, frames: int) -> None:
        """Make the memory for `frames` frames of every row resident (writes zeros: ctypes releases the GIL
        and wakes no thread pool)."""
        need = min(self.size, -(-4 * self.rows * frames * SAMPLES_PER_FRAME // PAGE) * PAGE)
        if need > self.touched:
            ctypes.memset(self.flat.data_ptr() + self.touched, 0, need - self.touched)
            self.touched = need

    def take(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [rows, samples] float32 on any device -> the same values in this memory, contiguous."""
        rows, samples = wav.shape
        if rows != self.rows or 4 * rows * samples > self.size:
            raise ValueError(f"{rows} x {samples} samples do not fit {self.rows} rows of {self.size} bytes")
        out = self.flat[: rows * samples].view(rows, samples)
        out.copy_(wav)
        return out


def touching(chunks, hosts: list):
    """Pass the decode loop's chunks through; at each, every (rows, HostAudio) pair of `hosts` whose rows have
    not all ended before it is touched for the frames decoded so far (memory grows until its last take ends)."""
    ended = set()
    for chunk in chunks:
        for rows, host in hosts:
            if not ended.issuperset(rows):
                host.touch(chunk.start + chunk.codes.shape[1])
        ended.update(chunk.ended)
        yield chunk
