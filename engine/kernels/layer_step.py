"""FusedLayer.step with the Triton kernels switched in (no Triton import here: `ks` dispatches).

Per layer and token: rms_norm, qkv matmul, qk_norm_rope_kv (norm + RoPE + both cache writes), attention
(or the 3-4 torch kernels when "attention" is not active), o_proj addmm (+ residual), rms_norm, gate/up
matmul, silu_mul, down addmm (+ residual): 9 kernels instead of ~22-27.
"""
from __future__ import annotations

import torch


def layer_step(ks, fl, x, cos, sin_signed, k_cache, v_cache, pos, bias):
    """Same contract as engine.gpu.fused_layers.FusedLayer.step; `fl` is the FusedLayer, `ks` a Kernels."""
    lay, b = fl.layer, x.shape[0]
    nh, nkv, d = fl.nh, fl.nkv, fl.d
    qkv = torch.nn.functional.linear(ks.rms_norm(x, lay.input_layernorm.weight, fl.eps), fl.qkv)
    q = ks.qk_norm_rope_kv(qkv, fl.qk_norm, cos, sin_signed, lay.self_attn.q_norm.eps, k_cache, v_cache, pos,
                           nh, nkv)
    out = ks.attention(q, k_cache, v_cache, bias, fl.scale)
    x = torch.addmm(x.view(b, -1), out.reshape(b, nh * d), lay.self_attn.o_proj.weight.t()).view(b, 1, -1)
    gu = torch.nn.functional.linear(ks.rms_norm(x, lay.post_attention_layernorm.weight, fl.eps), fl.gate_up)
    act = ks.silu_mul(gu)
    return torch.addmm(x.view(b, -1), act.view(b, -1), lay.mlp.down_proj.weight.t()).view(b, 1, -1)
