"""The codec's split residual vector quantizer, decode side only: codes -> summed codebook vectors."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DecoderConfig
from .state import derived


class Codebook(nn.Module):
    """Codebook stored as running sums: vector = embedding_sum / max(cluster_usage, 1e-5)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        # Look up, then divide: the same one division per element as dividing the whole table first.
        return F.embedding(codes, self.embedding_sum) / self.cluster_usage.clamp(min=1e-5)[codes][..., None]


class _CodebookSlot(nn.Module):
    """Holds one codebook under the name `_codebook` (the official nesting)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _CodebookList(nn.Module):
    def __init__(self, count: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_CodebookSlot(size, dim) for _ in range(count)])


class ResidualGroup(nn.Module):
    """A run of residual codebooks summed in a narrow space, then projected out (1x1 conv, no bias).

    `input_proj` serves only the encoder side; it is kept so the checkpoint's keys load strictly.
    """

    def __init__(self, count: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _CodebookList(count, size, dim)

    def _codewords(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(every codebook's vectors stacked [count * size, dim], each codebook's offset in it [count, 1]), kept
        (derived): embedding_sum / max(cluster_usage, 1e-5), the same division per element as Codebook.lookup."""
        books = [slot._codebook for slot in self.vq.layers]
        count = len(books)

        def make(*ps):
            table = torch.cat([s / u.clamp(min=1e-5)[:, None] for s, u in zip(ps[:count], ps[count:])])
            offsets = torch.arange(count, device=table.device)[:, None] * books[0].embedding_sum.shape[0]
            return table, offsets

        return derived(self, "_table", [b.embedding_sum for b in books] + [b.cluster_usage for b in books], make)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> [B, T, io_dim] (time-major): the K lookups in one embedding, summed in one op."""
        table, offsets = self._codewords()
        vectors = F.embedding(codes + offsets, table)  # [B, K, T, dim]
        total = vectors[:, 0] if vectors.shape[1] == 1 else vectors.sum(1)
        return F.linear(total, self.output_proj.weight.squeeze(-1))  # the 1x1 conv on [B, T, dim]


class SplitQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1..15 (acoustic) decoded separately, then added."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        dim, n_sem = cfg.codebook_dim // 2, cfg.num_semantic_quantizers
        self.n_semantic = n_sem
        self.rvq_first = ResidualGroup(n_sem, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualGroup(cfg.num_quantizers - n_sem, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] -> [B, T, codebook_dim]."""
        return self.rvq_first.decode(codes[:, : self.n_semantic]) + self.rvq_rest.decode(codes[:, self.n_semantic:])
