"""Host data onto the device without waiting for the GPU. A copy from pageable host memory to CUDA waits for all
the work queued on the stream: during a run the frames queued ahead, under a scheduler's load a new request's
prompt would wait for the loop's frames. Through pinned memory the copy is queued like any kernel."""
from __future__ import annotations

import torch


def device_longs(values: list, device) -> torch.Tensor:
    """A long tensor of `values` on `device`, copied without waiting for the GPU (to_device)."""
    return to_device(torch.tensor(values, dtype=torch.long), device)


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """Host tensor `t` on `device`; on CUDA through pinned memory, without blocking (a tensor already on a device
    moves as `.to` moves it)."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
