"""The codec decoder's sliding-window transformer: causal self-attention over the last `sliding_window` frames
(RoPE, no q/k norm), pre-norm layers with layer scale, between a latent -> hidden and a hidden -> latent
projection."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rope, sdpa
from .config import DecoderConfig
from .state import DecodeState, derived


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _RMSNorm(RMSNorm):
    """The transformer's RMSNorm as torch's one rms_norm op (fused on CUDA: 2 kernels instead of 8), then the
    weight: the same rounding points as RMSNorm (normalised in fp32, rounded to x.dtype, then scaled; rms_norm
    computes half-precision inputs in fp32 itself, a float64 input is normalised in fp32 as RMSNorm does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype == torch.float64 else x
        return self.weight * F.rms_norm(x32, (x.shape[-1],), eps=self.eps).to(x.dtype)


def _merged_rows(owner: nn.Module, name: str, linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linears' weights (and biases) stacked by output rows, made once and kept (derived): one matmul
    computes every output row as the separate ones do."""
    biases = [lin.bias for lin in linears if lin.bias is not None]
    params = [lin.weight for lin in linears] + biases
    n = len(linears)

    def make(*ps):
        return torch.cat(ps[:n]), (torch.cat(ps[n:]) if len(ps) > n else None)

    return derived(owner, name, params, make)


class SlidingAttention(nn.Module):
    """Causal self-attention in which frame i sees frames i - window + 1 .. i (RoPE, no q/k norm)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=bias)
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.window = cfg.sliding_window

    def forward(self, x, cos, sin, mask, state: DecodeState | None = None) -> torch.Tensor:
        """`mask` from SlidingTransformer.mask: [n, n], or [B, 1, n, window - 1 + n] with a state."""
        b, n, _ = x.shape
        h, hk = self.heads, self.kv_heads
        weight, bias = _merged_rows(self, "_qkv", [self.q_proj, self.k_proj, self.v_proj])
        qkv = F.linear(x, weight, bias).view(b, n, h + 2 * hk, self.head_dim)  # q, k, v in one matmul
        qk = apply_rope(qkv[:, :, : h + hk], cos[:, :, None], sin[:, :, None])  # RoPE on q and k in one pass
        q, k = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2)
        v = qkv[:, :, h + hk:].transpose(1, 2)
        if state is not None:  # fixed-size past: the last window - 1 keys (zeros before frame 0, masked)
            past = state.kv.get(self)
            if past is None:
                zeros = k.new_zeros(b, self.kv_heads, self.window - 1, self.head_dim)
                past = state.kv[self] = (zeros, zeros.clone())
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            keep = self.window - 1
            past[0].copy_(k[:, :, k.shape[2] - keep:])
            past[1].copy_(v[:, :, v.shape[2] - keep:])
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = sdpa(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.self_attn = SlidingAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU with gate and up in one matmul."""
        mlp = self.mlp
        weight, _ = _merged_rows(self, "_gate_up", [mlp.gate_proj, mlp.up_proj])
        gate_up = F.linear(x, weight)
        inter = gate_up.shape[-1] // 2
        return mlp.down_proj(F.silu(gate_up[..., :inter]) * gate_up[..., inter:])

    def forward(self, x, cos, sin, mask, state: DecodeState | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, state))
        return x + self.mlp_layer_scale(self._mlp(self.post_attention_layernorm(x)))


class SlidingTransformer(nn.Module):
    """latent -> hidden projection, pre-norm layers with layer scale, final norm, hidden -> latent."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.cfg = cfg

    def mask(self, n: int, device, first: torch.Tensor | None) -> torch.Tensor:
        """Bool: query i sees key j iff 0 <= i - j < window (relative to the chunk).

        One pass (first None): [n, n], the keys are the n frames themselves. Chunked: [B, 1, n, keys], the
        keys are window - 1 past frames then the n new ones, and past keys before a row's frame 0
        (first[b] + j - (window - 1) < 0) are the zero padding of a fresh row, so they are masked too. Tensor
        ops only, no host sync.
        """
        past = 0 if first is None else self.cfg.sliding_window - 1
        q = torch.arange(n, device=device)[:, None]
        k = torch.arange(-past, n, device=device)[None, :]
        mask = (k <= q) & (k > q - self.cfg.sliding_window)
        if first is not None:
            mask = mask & (k + first[:, None, None, None] >= 0)
        return mask

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        """x [B, T, latent] -> [B, T, latent]; each row's positions continue from state.frames when chunked
        (rows of one state may be at different positions)."""
        h = self.input_proj(x)
        b, n = h.shape[:2]
        first = state.position(h.device, b) if state is not None else None
        pos = torch.arange(n, device=h.device)[None]
        if first is not None:
            pos = pos + first[:, None]  # integers < 2^24 become exact fp32 angles: the same as one pass
        cos, sin = self.rotary(pos, h.dtype)  # [1 or B, n, head_dim]
        mask = self.mask(n, h.device, first)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, state)
        return self.output_proj(self.norm(h))
