"""The code predictor ("sub-talker"): codebooks 1..15 of a frame from the talker hidden state and c0.

Per frame, with a fresh cache and P = small_to_mtp_projection (Identity when the widths are equal):

* prefill positions 0, 1 with [P(h), P(E_talker(c0))]; lm_head[0] on position 1 gives c1;
* for j = 2..15: one step at position j with P(codec_embedding[j-2](c_{j-1})); lm_head[j-1] gives c_j.

`h` is the talker's post-norm hidden state at the position whose logits produced c0.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..config import TalkerConfig
from .kv_cache import KVCache
from .layers import DecoderStack, embedding


class PredictorBody(DecoderStack):
    """`code_predictor.model`: the decoder stack plus 15 codebook embeddings of the talker width."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg.predictor)
        groups = cfg.num_code_groups - 1
        self.codec_embedding = nn.ModuleList(
            embedding(cfg.predictor.vocab_size, cfg.hidden_size) for _ in range(groups)
        )


class CodePredictor(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        p = cfg.predictor
        self.num_groups = cfg.num_code_groups - 1  # codebooks predicted here (15)
        self.model = PredictorBody(cfg)
        self.lm_head = nn.ModuleList(nn.Linear(p.hidden_size, p.vocab_size, bias=False) for _ in range(self.num_groups))
        if p.hidden_size != cfg.hidden_size:
            self.small_to_mtp_projection = nn.Linear(cfg.hidden_size, p.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def new_cache(self, batch: int) -> KVCache:
        w = self.lm_head[0].weight
        p = self.cfg.predictor
        return KVCache(p.num_layers, batch, p.num_kv_heads, self.cfg.num_code_groups, p.head_dim, w.dtype, w.device)

    def step_logits(self, embeds: torch.Tensor, cache: KVCache, start: int, head: int) -> torch.Tensor:
        """Talker-width embeds [B, L, Ht] at positions start.. -> lm_head[head] logits of the last position."""
        hidden = self.model(self.small_to_mtp_projection(embeds), cache, start)
        # The head runs over every position, as upstream does, and the last row is taken afterwards:
        # a matmul over 2 rows can round differently from one over 1 row, and this keeps fp32 bit-exact.
        return self.lm_head[head](hidden)[:, -1]

    def predict(self, talker_hidden: torch.Tensor, c0_embed: torch.Tensor,
                choose: Callable[[torch.Tensor, int], torch.Tensor], cache: KVCache) -> torch.Tensor:
        """Codes [B, 15] for codebooks 1..15 of one frame.

        talker_hidden [B, Ht]: post-norm talker hidden that produced c0; c0_embed [B, Ht] = embed_codec(c0).
        choose(logits [B, 2048] fp32, j) -> LongTensor [B] picks codebook j. `cache` is overwritten.
        """
        x = torch.stack((talker_hidden, c0_embed), dim=1)
        code = choose(self.step_logits(x, cache, 0, 0).float(), 1)
        codes = [code]
        for j in range(2, self.num_groups + 1):
            x = self.model.codec_embedding[j - 2](code)[:, None]
            code = choose(self.step_logits(x, cache, j, j - 1).float(), j)
            codes.append(code)
        return torch.stack(codes, dim=1)

    def residual_embedding_sum(self, codes: torch.Tensor, c0_embed: torch.Tensor | None = None) -> torch.Tensor:
        """codes [B, 15] -> Σ_i codec_embedding[i](codes[:, i]), [B, Ht].

        With `c0_embed` [B, Ht] the talker's E(c0) is included as the first term of one reduction, which
        is exactly how upstream forms the next talker input (the same rounding in bf16).
        """
        parts = [emb(codes[:, i]) for i, emb in enumerate(self.model.codec_embedding)]
        if c0_embed is not None:
            parts.insert(0, c0_embed)
        return self.embedding_sum(parts)

    @staticmethod
    def embedding_sum(parts: list) -> torch.Tensor:
        """The one reduction of residual_embedding_sum over embeddings already looked up ([B, Ht] each, in
        its order: E(c0) first when included, then codebooks 1..15)."""
        return torch.stack(parts, dim=1).sum(dim=1)
