"""Arrival counters of the split kernels: linear's split-K, attention's split-KV, mlp's summing programs.

Each launch counts its programs' arrivals in int32 words and leaves them at zero, so one set serves every
launch that follows another on one stream. A set belongs to one engine's `Kernels` table and goes with it
(`release`, from Engine.release): a set shared by the whole process pinned three of the caching allocator's
2 MiB segments after every engine was released, and two engines replaying graphs on two streams would count
into the same words. Launchers called without a set (tests, benches) use `SHARED`."""
from __future__ import annotations

import torch

# Words a launch may use: linear one a column block, attention one a (row, kv head), mlp two.
SIZES = {"linear": 1 << 16, "attention": 1 << 12, "mlp": 2}


class Counters:
    """Zeroed counters for each kernel family and device, made on first use (a graph's warm-up run, not its
    capture: made inside a capture they would be the graph's own memory, zeroed on every replay)."""

    def __init__(self):
        self._made: dict[tuple, torch.Tensor] = {}  # (kind, device as asked for) -> one tensor a device

    def get(self, kind: str, device) -> torch.Tensor:
        made = self._made.get((kind, device))  # every launch asks: one dict lookup when the set exists
        return made if made is not None else self._make(kind, device)

    def _make(self, kind: str, device) -> torch.Tensor:
        asked = torch.device(device)
        where = asked
        if where.type == "cuda" and where.index is None:  # "cuda": the current device's set, looked up each time
            where = torch.device("cuda", torch.cuda.current_device())
        if (kind, where) not in self._made:
            if where.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{kind} arrival counters first asked for inside a CUDA graph capture: "
                                   "run the body once before capturing it (engine/gpu/capture.py does)")
            self._made[(kind, where)] = torch.zeros(SIZES[kind], dtype=torch.int32, device=where)
        if asked == where:  # the same device by another name ("cpu", "cuda:0"): found at once next time
            self._made[(kind, device)] = self._made[(kind, where)]
        return self._made[(kind, where)]

    def release(self) -> None:
        """Drop every counter (the graphs that baked their addresses must be gone first)."""
        self._made.clear()


SHARED = Counters()


def of(counters: Counters | None, kind: str, device) -> torch.Tensor:
    """`kind`'s counters on `device` from `counters`, or from SHARED when a launcher was given none."""
    return (SHARED if counters is None else counters).get(kind, device)
