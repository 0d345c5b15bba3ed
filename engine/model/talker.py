"""The talker: 28 Qwen3 layers over summed text/codec embeddings, predicting codebook 0 of each frame.

Module names equal the official ones, so the `talker.`-stripped checkpoint keys load with strict=True:
`model.{layers.N.*, norm, codec_embedding, text_embedding}`, `text_projection.linear_fc{1,2}`,
`codec_head`, `code_predictor.*`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TalkerConfig
from ..errors import PromptTooLongError
from .code_predictor import CodePredictor
from .kv_cache import KVCache
from .layers import DecoderStack, embedding


class TalkerBody(DecoderStack):
    """`talker.model`: the decoder stack plus the codec and text embedding tables."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg.layers)
        self.codec_embedding = embedding(cfg.layers.vocab_size, cfg.hidden_size)
        self.text_embedding = embedding(cfg.text_vocab_size, cfg.text_hidden_size)


PROJECTION_ROWS = 256  # tokens per text-projection matmul on CUDA (see Talker.embed_text)


class TextProjection(nn.Module):
    """text_hidden -> text_hidden -> talker hidden, SiLU in between, with biases."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBody(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.layers.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """text_projection(text_embedding(ids)), [..., H].

        On CUDA the projection runs over blocks of PROJECTION_ROWS tokens (the last one zero-padded), so its
        matmuls have one shape whatever the prompt's length: a token count never seen before costs a new
        matmul plan, and in ComfyUI nearly every request has a new length. Rows are independent, so the padding
        changes nothing; on the CPU the matmuls keep the exact shapes (the official package's parity)."""
        x = self.model.text_embedding(ids)
        if x.device.type != "cuda":
            return self.text_projection(x)
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        rows = F.pad(rows, (0, 0, 0, -n % PROJECTION_ROWS))
        blocks = [self.text_projection(block) for block in rows.split(PROJECTION_ROWS)]
        out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        return out[:n].view(*ids.shape, -1)

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """The talker's codec embedding (codebook 0, control and speaker ids), [..., H]."""
        return self.model.codec_embedding(ids)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        w = self.model.codec_embedding.weight
        c = self.cfg.layers
        return KVCache(c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim, w.dtype, w.device)

    def forward_hidden(self, embeds: torch.Tensor, cache: KVCache, start) -> torch.Tensor:
        """embeds [B, L, H] at positions start..start+L-1 -> hidden after the final norm, [B, L, H].

        Writes K/V at cache positions start..start+L-1. Every row shares the positions (no padding), or,
        for single-token steps, `start` is a list with one position per row.
        """
        end = (max(start) if isinstance(start, list) else start) + embeds.shape[1]
        if end > cache.max_len:
            raise PromptTooLongError(
                f"talker step needs cache positions up to {end} but the cache holds {cache.max_len}; "
                "raise max_seq_len or shorten the text / reference audio / max_new_tokens."
            )
        return self.model(embeds, cache, start)

    def codec_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """codec_head: [..., H] -> [..., 3072] in the model dtype."""
        return self.codec_head(hidden)
