"""Programmatic dependent launch (PDL, Hopper and newer): a kernel may start while the one before it
in the stream is still running, and waits for it only where it needs its results.

A decode frame is hundreds of small launches back to back; each GEMV reads a few MB of weights, and most of
its time is the launch, the DRAM latency ramp and the tail, not bytes at HBM speed.
With PDL the next launch's programs are already resident when the previous kernel drains, and the
linear kernel issues its weight loads (weights are never written) before it waits, so those bytes
stream in under the previous kernel's tail.

Rules every kernel launched with PDL follows (`enter`):
  * before `enter` it only reads weights: nothing written by any kernel of the graph;
  * `enter` waits until the previous kernel in the stream has completed and its writes are visible,
    then lets the next kernel launch (so at most one kernel runs ahead, parked on its own wait);
  * a kernel launched without PDL (torch's) waits for full completion as usual, so mixing is safe.
With PDL off (`PDL=False`, no launch attribute) the kernels are exactly the plain launches.
"""
from __future__ import annotations

import functools

triton = tl = gdc_wait = gdc_launch_dependents = None  # bound on first use by enter()


def support(device) -> tuple[bool, str]:
    """(True, '') when kernels on `device` can launch with PDL, else (False, why)."""
    import torch

    from . import interpreting

    if interpreting():
        return False, "the Triton interpreter has no PDL"
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False, "PDL needs a CUDA device"
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 9:
        return False, f"PDL needs compute capability >= 9.0 (device has {major}.x)"
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False, "this Triton has no grid dependency control (triton >= 3.4)"
    return True, ""


@functools.cache
def enter():
    """The jitted `pdl_enter(PDL)` every kernel calls before it touches data another kernel writes."""
    global triton, tl, gdc_wait, gdc_launch_dependents
    import triton
    import triton.language as tl

    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # only ever called with PDL=False then (support() said no)
        pass

    @triton.jit
    def pdl_enter(PDL: tl.constexpr):
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

    return pdl_enter


def launch_options(pdl: bool) -> dict:
    """Keyword arguments of a kernel launch: the PDL constexpr, and the launch attribute when on."""
    return {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}
