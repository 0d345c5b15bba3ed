"""A split-K sum left for the next linear to finish: the producer's programs store their fp32 partials and
exit; the consumer's prologue adds them (with the residual) as it loads its input row.

Why: a split-K launch ends with a meeting. Each program stores its partial, counts itself in at an atomic,
and the last arrival reads every partial back, adds the residual and stores the row: two L2 round trips
after the products, on the critical path of every one of them. The next launch reads its input row in its
prologue anyway, and reads the partials in that same round trip instead; they are more bytes (up to 8 fp32
rows for one bf16 row), so the frame gains part of what the meeting costs.

The sum is the last arrival's: the partials added in split order starting from +0.0, then the residual, all
in fp32, rounded once to the activation dtype, so the bits are those of the finished launch. Column block 0
of the consumer also stores the rounded row in `out`, the value later launches take as their residual.

A `SplitSum` is only ever handed from one Triton linear (or attention_o_proj) launch to another: `Kernels`
defers a launch only where its consumer takes one (Kernels.defers), and a torch path never sees it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# The most rows at which each producer defers its sum (0: never); the linear's own rule also keeps it to the FMA
# path and rows <= 1024 wide (linear.defers_here). (attention_o_proj runs at one row only.)
DEFER_ROWS = {"linear": 2, "attention_o_proj": 1}


@dataclass
class SplitSum:
    """part: fp32 partials [S, M, N]; residual: [M, N] rows contiguous; out: [..., N], filled by the consumer."""
    part: torch.Tensor
    residual: torch.Tensor
    out: torch.Tensor

    @property
    def splits(self) -> int:
        return self.part.shape[0]

    @property
    def shape(self):
        return self.out.shape

    @property
    def dtype(self):
        return self.out.dtype


def made(x):
    """A launch's input as a tensor: a SplitSum's `out`, which its consumer has filled by now, or x itself."""
    return x.out if isinstance(x, SplitSum) else x


def reference(s: SplitSum) -> torch.Tensor:
    """The finished sum in torch, in the kernels' order (the test oracle): [..., N]."""
    acc = torch.zeros_like(s.part[0])
    for p in s.part:
        acc = acc + p
    return (acc + s.residual.float()).to(s.dtype).view(s.shape)
