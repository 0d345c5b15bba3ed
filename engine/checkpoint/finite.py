"""Weights that hold no number: a tensor made only of NaN or Inf is refused at load, a tensor with some of them
is reported.

A tensor with no finite value can only come from a damaged file (a download filled with garbage, a failed
conversion); every output would be NaN or noise, so the load fails with CheckpointError naming the file and the
tensor, rather than the user hearing silence or noise with no explanation. A few non-finite values may sit in
rows the model never reads (unused token embeddings), so they are a warning, not an error.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError

log = logging.getLogger(__name__)


@torch.no_grad()
def check_finite(module: nn.Module, weights: Path, prefix: str = "") -> None:
    """Raise CheckpointError if a floating tensor of `module` holds no finite value; log a warning naming the
    tensors that hold some non-finite values.

    One float32 sum per tensor finds them all in one read of the weights and one device sync (a NaN or Inf
    anywhere makes the sum non-finite; real weights are far too small to overflow it); only the tensors it flags
    are looked at element by element."""
    named = [(n, t) for n, t in list(module.named_parameters()) + list(module.named_buffers())
             if t.is_floating_point() and t.numel() and not t.is_meta]
    if not named:
        return
    sums = torch.stack([t.sum(dtype=torch.float32) for _, t in named]).tolist()
    flagged = [(prefix + n, t) for (n, t), total in zip(named, sums) if not math.isfinite(total)]
    if not flagged:
        return
    none = [n for n, t in flagged if not bool(torch.isfinite(t).any())]
    if none:
        raise CheckpointError(
            f"{weights}: tensor '{none[0]}'" + (f" (and {len(none) - 1} more)" if len(none) > 1 else "")
            + " holds only NaN or Inf values; the file is damaged. Delete it and download it again.")
    log.warning("%s: tensor '%s'%s holds NaN or Inf values; the output may be noise. If it is, download the "
                "checkpoint again.", weights, flagged[0][0],
                f" (and {len(flagged) - 1} more)" if len(flagged) > 1 else "")
