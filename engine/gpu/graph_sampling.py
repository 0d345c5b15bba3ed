"""Graph-safe sampling: every setting is a 0-d device tensor, so changing it never forces a recapture.

Same semantics as engine.sampling.choose: greedy argmax, or temperature -> top-k (keep ids whose logit
is >= the k-th largest; k = 0 disables) -> top-p (smallest set with mass >= p) -> exponential race.
"""
from __future__ import annotations

import torch


def kth_index(top_k: int, vocab: int) -> int:
    """Sorted position of the k-th largest logit (top_k = 0 or >= vocab keeps everything)."""
    return min(top_k, vocab) - 1 if top_k > 0 else vocab - 1


def choose(logits, do_sample, temperature, k_index, top_p, u, first, out=None):
    """logits [B, V] float32, u [B, V] uniforms in (0, 1) -> ids [B] (written into `out` when given).

    k_index: 0-d long from kth_index(); first: bool [B, V] with only column 0 set (a static buffer).
    """
    greedy = torch.argmax(logits, dim=-1)
    sorted_logits, order = torch.sort(logits / temperature, dim=-1, descending=True)
    kth = sorted_logits.index_select(-1, k_index.view(1))
    keep = sorted_logits >= kth
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    keep = keep & ((mass_before < top_p) | first)
    race = (probs * keep) / (-torch.log(u.gather(-1, order)))
    sampled = order.gather(-1, torch.argmax(race, dim=-1, keepdim=True)).squeeze(-1)
    if out is None:
        return torch.where(do_sample, sampled, greedy)
    return torch.where(do_sample, sampled, greedy, out=out)
