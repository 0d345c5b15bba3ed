"""One way to capture a CUDA graph, shared by the frame graphs and the codec graphs."""
from __future__ import annotations

import torch


def capture(body, pool=None, warmups: int = 1):
    """Run `body()` `warmups` times on a side stream (library set-up, kernel selection and lazy
    allocations happen there, not in the capture), then capture one call into a new graph on `pool`.
    Returns (graph, what body returned). One warm-up is enough: every lazy set-up happens on a first call,
    and each extra one adds a whole eager run to the load time.

    The warm-up calls really run: callers snapshot and restore whatever state they advance."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = body()
    return graph, out
