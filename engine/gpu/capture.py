"""One way to capture a CUDA graph, shared by the frame graphs and the codec graphs."""
from __future__ import annotations

import torch


def capture(body, pool=None, warmups: int = 1):
    """Run `body()` `warmups` times on a side stream (library set-up, kernel selection and lazy
    allocations happen there, not in the capture), then capture one call into a new graph on `pool`.
    Returns (graph, what body returned). One warm-up is enough: every lazy set-up happens on a first call,
    and each extra one adds a whole eager run to the load time.

    The warm-up calls and the replay really run: callers snapshot and restore whatever state they advance."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            body()
        # Captured here, behind the warm-up, with capture_begin / capture_end rather than torch.cuda.graph,
        # whose entry synchronizes the device and empties the device and pinned-host memory caches before
        # every capture (13 times a load). thread_local: only this thread's own unsafe calls are refused while
        # it captures; the codec's graphs are captured on a thread while the talker's weights load
        # (CodecGraphs.precapture_beside), and a host such as ComfyUI has threads of its own.
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            out = body()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    # A graph's first launch also uploads it to the device: replayed once here, so that cost is paid at
    # capture, not by the first request that replays it.
    graph.replay()
    return graph, out
