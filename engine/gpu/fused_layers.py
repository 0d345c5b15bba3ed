"""Fewer, larger kernels for decoder steps: single-token decode and the T tokens of a prompt (both
graphed, both launch-bound).

`fuse_projections` concatenates q/k/v and gate/up weights once and re-points the original parameters at
row slices of the merged tensors, so no memory is duplicated and the eager modules keep working. Then
`FusedLayer.step` runs one layer for one token through a `Kernels` dispatch table (engine/kernels), so
the same code is the plain-torch path (every kernel off: each op is its torch reference) and the Triton
path. Per layer and token:
  * RMSNorm + one q/k/v matmul;
  * q_norm and k_norm as a single RMSNorm over the 24 (16 + 8) heads, RoPE on q and k together, and
    both cache writes;
  * attention over a fixed window of the static cache with an additive mask;
  * o_proj with the residual added in its epilogue;
  * RMSNorm + one gate/up matmul;
  * SwiGLU + down_proj with the residual added in its epilogue.
With Triton that is 6 launches (engine/kernels/linear.py fuses the norms, SwiGLU and residuals into the
matmuls; at 1-2 rows a split-K launch leaves its sum to the next linear, engine/kernels/split_sum.py), 4 where
the q/k norm, attention and o_proj fit one launch (engine/kernels/attention_o_proj.py: the code predictor at
one take); in torch about 20. `prefill`
runs a fresh prompt's T tokens the same way with ~10 launches a layer (cuBLAS matmuls, which win at T
rows; one-launch norms and q/k norm + RoPE + cache write; the residuals added in the matmuls' epilogues)
instead of ~53 op by op. Numerics follow engine/model/layers.py: RMSNorm normalises in fp32, casts back,
then scales; RoPE tables come in the activation dtype; softmax runs in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import Kernels
from ..kernels.split_sum import made
from ..model.layers import DecoderLayer, DecoderStack, sdpa

NO_KERNELS = Kernels()  # every op runs as its torch reference


class FusedLayer:
    """Merged weights of one DecoderLayer (views shared with the module's own parameters)."""

    def __init__(self, layer: DecoderLayer):
        attn = layer.self_attn
        self.layer = layer
        self.nh, self.nkv, self.d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = attn.scale
        self.eps = layer.input_layernorm.eps
        self.qk_eps = attn.q_norm.eps
        with torch.no_grad():
            self.qkv = _share_merged_rows([attn.q_proj, attn.k_proj, attn.v_proj])
            self.gate_up = _share_merged_rows([layer.mlp.gate_proj, layer.mlp.up_proj])
            self.qk_norm = torch.cat([attn.q_norm.weight.expand(self.nh, self.d),
                                      attn.k_norm.weight.expand(self.nkv, self.d)])

    def step(self, ks: Kernels, x, cos, sin_signed, k_cache, v_cache, pos, bias, share=None, defer_out=False,
             spend_x=False):
        """x [B, 1, H] at position pos ([1] long); attends over the first len(bias) cache positions (`share`:
        engine/kernels/attention._launch). x may be a SplitSum (engine/kernels/split_sum.py) left by the layer
        before; defer_out: this layer's output may be one too (its consumer is the next layer's qkv linear).
        Inside the layer, o_proj's sum is left to the gate/up linear where the kernels allow it. spend_x: x is
        the layer before's output, read by no one else, so the residual sums may be made in its memory."""
        lay = self.layer
        qkv = ks.linear(x, self.qkv, prologue="rms_norm", norm_weight=lay.input_layernorm.weight, eps=self.eps)
        x = made(x)  # the qkv launch stored a deferred input's row
        x = ks.attention_o_proj(qkv, self.qk_norm, cos, sin_signed, self.qk_eps, k_cache, v_cache, pos, bias,
                                self.scale, self.nh, self.nkv, lay.self_attn.o_proj.weight, x, share, defer=True,
                                spend_residual=spend_x)
        return ks.mlp(x, self.gate_up, lay.post_attention_layernorm.weight, self.eps, lay.mlp.down_proj.weight,
                      defer=defer_out)

    def prefill(self, ks: Kernels, x, cos, sin_signed, k_cache, v_cache):
        """x [T, H] at positions 0..T-1 of a fresh prompt -> [T, H]; writes positions 0..T-1 of the batch-1
        caches and attends causally over them (as DecoderLayer at start 0)."""
        lay, t = self.layer, x.shape[0]
        qkv = F.linear(ks.rms_norm(x, lay.input_layernorm.weight, self.eps), self.qkv)
        q = ks.qk_norm_rope_kv_prefill(qkv, self.qk_norm, cos, sin_signed, self.qk_eps, k_cache, v_cache,
                                       self.nh, self.nkv)
        out = sdpa(q.view(1, t, self.nh, self.d).transpose(1, 2), k_cache[:, :, :t], v_cache[:, :, :t],
                   is_causal=t > 1, scale=self.scale, enable_gqa=self.nh != self.nkv)
        x = torch.addmm(x, out.transpose(1, 2).reshape(t, self.nh * self.d), lay.self_attn.o_proj.weight.t())
        gu = F.linear(ks.rms_norm(x, lay.post_attention_layernorm.weight, self.eps), self.gate_up)
        inter = gu.shape[-1] // 2
        # x is this layer's own tensor: the second residual is added in place, in the matmul's epilogue
        return x.addmm_(F.silu(gu[:, :inter]) * gu[:, inter:], lay.mlp.down_proj.weight.t())


def _share_merged_rows(linears) -> torch.Tensor:
    """The linears' weights stacked by output rows into one tensor, each linear's weight re-pointed at its rows
    of it: one copy in memory, shared (unlike the codec's _merged_rows, which keeps a derived copy beside them).
    Weights the loader already laid out that way (DecoderLayer.MERGED_ROWS) are taken as they are: no copy,
    and no freed originals left as holes in the allocator's segments."""
    adjacent = _adjacent_rows([lin.weight for lin in linears])
    if adjacent is not None:
        return adjacent
    merged = torch.cat([lin.weight for lin in linears], 0)
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(merged[start: start + rows], requires_grad=False)
        start += rows
    return merged


def _adjacent_rows(weights) -> torch.Tensor | None:
    """The weights as one [rows, cols] view when they are consecutive row-major rows of one storage, else None."""
    first = weights[0]
    offset, cols = first.storage_offset(), first.shape[-1]  # checked 2-D below, with the others
    for w in weights:
        if (w.dim() != 2 or not w.is_contiguous() or w.shape[1] != cols or w.dtype != first.dtype
                or w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or w.storage_offset() != offset):
            return None
        offset += w.numel()
    return first.detach().as_strided((sum(w.shape[0] for w in weights), cols), (cols, 1))


def fused(layer: DecoderLayer) -> FusedLayer:
    """The layer's FusedLayer, made once: merging again would re-point the parameters at new storage and
    leave graphs captured earlier reading freed memory. A move or cast of the layer drops it
    (DecoderLayer._apply): its merged tensors are the old device storage of the parameters."""
    if "_fused" not in layer.__dict__:
        layer.__dict__["_fused"] = FusedLayer(layer)
    return layer.__dict__["_fused"]


class FusedStack:
    """Single-token steps over a DecoderStack (talker or code predictor)."""

    def __init__(self, stack: DecoderStack, kernels: Kernels | None = None):
        self.stack = stack
        self.layers = [fused(layer) for layer in stack.layers]
        self.ks = kernels or NO_KERNELS  # None or nothing active: every op as its torch reference

    def rope(self, pos: torch.Tensor, dtype):
        cos, sin = self.stack.rotary(pos, dtype)
        half = cos.shape[-1] // 2
        # rotate_half(x) * sin == cat(x2, x1) * [-sin1, sin2]
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), -1)

    def step(self, x, cache, pos, bias, rope=None, final_norm=True, share=None):
        """x [B, 1, H] at position pos ([1] long) -> hidden [B, 1, H], after the final norm unless
        final_norm=False (the caller then fuses the norm into its head, or only needed the cache). `share`: the
        rows whose prompt K/V another row's copy can stand for (engine/kernels/attention._launch)."""
        cos, sin_signed = rope if rope is not None else self.rope(pos, x.dtype)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):  # the last layer's sum is made in its own launch
            x = layer.step(self.ks, x, cos, sin_signed, cache.k[i], cache.v[i], pos, bias, share, defer_out=i < last,
                           spend_x=i > 0)  # the stack's input is the caller's
        if not final_norm:
            return x
        norm = self.stack.norm
        return self.ks.rms_norm(x, norm.weight, norm.eps)

    def prefill(self, x, cache, rope):
        """x [1, T, H] at positions 0..T-1 of a fresh prompt, written into the batch-1 `cache` -> hidden
        [1, T, H] after the final norm. `rope`: (cos, sin_signed) [T, D] of positions 0..T-1."""
        cos, sin_signed = rope
        h = x[0]
        for i, layer in enumerate(self.layers):
            h = layer.prefill(self.ks, h, cos, sin_signed, cache.k[i], cache.v[i])
        norm = self.stack.norm
        return self.ks.rms_norm(h, norm.weight, norm.eps)[None]

    def head(self, x, weight):
        """The final norm and a head ([V, H] weight) in one: logits [B, V]."""
        norm = self.stack.norm
        return self.ks.linear(x, weight, prologue="rms_norm", norm_weight=norm.weight, eps=norm.eps)

    def whole_pass(self, x, cache, pos, bias, rope, head_weight, fill_only=False):
        """One pass over the layers: logits [B, V] of head_weight after the final norm (fused into the head's
        matmul), or, when fill_only, only the cache writes (returns None)."""
        h = self.step(x, cache, pos, bias, rope, final_norm=False)
        return None if fill_only else self.head(h[:, -1], head_weight)
