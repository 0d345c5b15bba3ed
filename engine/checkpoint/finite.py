"""Weights that hold no number: a tensor made only of NaN or Inf is refused at load, a tensor with some of them
is reported.

A tensor with no finite value can only come from a damaged file (a download filled with garbage, a failed
conversion); every output would be NaN or noise, so the load fails with CheckpointError naming the file and the
tensor, rather than the user hearing silence or noise with no explanation. A few non-finite values may sit in
rows the model never reads (unused token embeddings), so they are a warning, not an error.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError

log = logging.getLogger(__name__)


def _any_all(finite: torch.Tensor) -> torch.Tensor:
    return torch.stack([finite.any(), finite.all()])


@torch.no_grad()
def check_finite(module: nn.Module, weights: Path, prefix: str = "") -> None:
    """Raise CheckpointError if a floating tensor of `module` holds no finite value; log a warning naming the
    tensors that hold some non-finite values. One pass over the weights and one device sync."""
    named = [(n, t) for n, t in list(module.named_parameters()) + list(module.named_buffers())
             if t.is_floating_point() and t.numel() and not t.is_meta]
    if not named:
        return
    flags = torch.stack([_any_all(torch.isfinite(t)) for _, t in named]).cpu()
    none = [prefix + n for (n, _), (any_ok, _) in zip(named, flags.tolist()) if not any_ok]
    if none:
        raise CheckpointError(
            f"{weights}: tensor '{none[0]}'" + (f" (and {len(none) - 1} more)" if len(none) > 1 else "")
            + " holds only NaN or Inf values; the file is damaged. Delete it and download it again.")
    some = [prefix + n for (n, _), (_, all_ok) in zip(named, flags.tolist()) if not all_ok]
    if some:
        log.warning("%s: tensor '%s'%s holds NaN or Inf values; the output may be noise. If it is, download the "
                    "checkpoint again.", weights, some[0], f" (and {len(some) - 1} more)" if len(some) > 1 else "")
