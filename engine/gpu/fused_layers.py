"""Fewer, larger kernels for single-token decoder steps (the graphed frame is launch-bound).

`fuse_projections` concatenates q/k/v and gate/up weights once and re-points the original parameters at
row slices of the merged tensors, so no memory is duplicated and the eager modules keep working. Then
`token_step` runs one layer for one token with:
  * one q/k/v matmul and one gate/up matmul;
  * q_norm and k_norm as a single RMSNorm over the 24 (16 + 8) heads, RoPE on q and k together;
  * attention over a fixed window of the static cache with an additive mask.
Numerics follow engine/model/layers.py: RMSNorm normalises in fp32, casts back, then scales; RoPE
tables come in the activation dtype; softmax runs in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.layers import DecoderLayer, DecoderStack


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Upstream's RMSNorm order in two kernels: F.rms_norm normalises in fp32 internally and rounds to
    the input dtype once, then the weight multiplies in that dtype."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * weight


class FusedLayer:
    """Merged weights of one DecoderLayer (views shared with the module's own parameters)."""

    def __init__(self, layer: DecoderLayer):
        attn = layer.self_attn
        self.layer = layer
        self.nh, self.nkv, self.d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = attn.scale
        self.eps = layer.input_layernorm.eps
        with torch.no_grad():
            self.qkv = _merge_rows([attn.q_proj, attn.k_proj, attn.v_proj])
            self.gate_up = _merge_rows([layer.mlp.gate_proj, layer.mlp.up_proj])
            self.qk_norm = torch.cat([attn.q_norm.weight.expand(self.nh, self.d),
                                      attn.k_norm.weight.expand(self.nkv, self.d)])
        self.inter = layer.mlp.gate_proj.weight.shape[0]

    def step(self, x, cos, sin_signed, k_cache, v_cache, pos, bias):
        """x [B, 1, H] at position pos ([1] long); attends over the first len(bias) cache positions."""
        lay, b = self.layer, x.shape[0]
        nh, nkv, d = self.nh, self.nkv, self.d
        qkv = F.linear(rms(x, lay.input_layernorm.weight, self.eps), self.qkv)
        qk = rms(qkv[..., : (nh + nkv) * d].view(b, nh + nkv, d), self.qk_norm, lay.self_attn.q_norm.eps)
        half = d // 2
        qk = torch.addcmul(qk * cos, torch.cat((qk[..., half:], qk[..., :half]), -1), sin_signed)
        k_cache.index_copy_(2, pos, qk[:, nh:, None])
        v_cache.index_copy_(2, pos, qkv[..., (nh + nkv) * d:].view(b, nkv, 1, d))
        window = bias.shape[-1]
        scores = torch.matmul(qk[:, :nh].reshape(b, nkv, nh // nkv, d), k_cache[:, :, :window].transpose(-1, -2))
        probs = torch.softmax(torch.add(bias, scores, alpha=self.scale), dim=-1)  # fp32 inside
        out = torch.matmul(probs, v_cache[:, :, :window])
        # residual adds ride on the matmul epilogues: x + o @ W^T in one kernel
        x = torch.addmm(x.view(b, -1), out.view(b, nh * d), lay.self_attn.o_proj.weight.t()).view(b, 1, -1)
        gu = F.linear(rms(x, lay.post_attention_layernorm.weight, self.eps), self.gate_up)
        act = F.silu(gu[..., : self.inter]) * gu[..., self.inter:]
        return torch.addmm(x.view(b, -1), act.view(b, -1), lay.mlp.down_proj.weight.t()).view(b, 1, -1)


def _merge_rows(linears) -> torch.Tensor:
    merged = torch.cat([lin.weight for lin in linears], 0)
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(merged[start: start + rows], requires_grad=False)
        start += rows
    return merged


def fused(layer: DecoderLayer) -> FusedLayer:
    """The layer's FusedLayer, made once: merging again would re-point the parameters at new storage and
    leave graphs captured earlier reading freed memory."""
    if "_fused" not in layer.__dict__:
        layer.__dict__["_fused"] = FusedLayer(layer)
    return layer.__dict__["_fused"]


class FusedStack:
    """Single-token steps over a DecoderStack (talker or code predictor)."""

    def __init__(self, stack: DecoderStack, kernels=None):
        self.stack = stack
        self.layers = [fused(layer) for layer in stack.layers]
        self.kernels = kernels  # engine.kernels.Kernels with something active, or None for plain torch

    def rope(self, pos: torch.Tensor, dtype):
        cos, sin = self.stack.rotary(pos, dtype)
        half = cos.shape[-1] // 2
        # rotate_half(x) * sin == cat(x2, x1) * [-sin1, sin2]
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), -1)

    def step(self, x, cache, pos, bias, rope=None):
        """x [B, 1, H] at position pos ([1] long) -> hidden after the final norm [B, 1, H]."""
        cos, sin_signed = rope if rope is not None else self.rope(pos, x.dtype)
        if self.kernels:
            from ..kernels.layer_step import layer_step

            for i, layer in enumerate(self.layers):
                x = layer_step(self.kernels, layer, x, cos, sin_signed, cache.k[i], cache.v[i], pos, bias)
        else:
            for i, layer in enumerate(self.layers):
                x = layer.step(x, cos, sin_signed, cache.k[i], cache.v[i], pos, bias)
        return self.stack.norm(x)
