"""A key by content for caches of what is made from a tensor (an ICL reference's prompt embeddings, the codec state
after it): an equal tensor in other memory, such as a voice loaded again from its file, finds the same entry."""
from __future__ import annotations

import hashlib

import torch


def content_key(t: torch.Tensor) -> tuple:
    """(dtype, shape, sha1 of the bytes) of `t` (read on the host)."""
    data = t.detach().cpu().contiguous()
    digest = hashlib.sha1(data.numpy().tobytes(), usedforsecurity=False).hexdigest()
    return str(data.dtype), tuple(data.shape), digest
