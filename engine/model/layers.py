"""Qwen3 decoder building blocks shared by the talker and the code predictor.

Numerics follow the published model so fp32 runs match it to rounding and bf16 runs stay close:

* RMSNorm squares and averages in fp32, casts the normalised values back to the input dtype, and only
  then scales by the weight (in the input dtype).
* RoPE angles, cos and sin are computed in fp32 and cast to the activation dtype afterwards; the
  rotation itself runs in the activation dtype. `inv_freq` stays fp32 even when the module is cast.
* q_norm / k_norm are RMSNorms over head_dim, applied per head before RoPE.

The talker's config declares interleaved M-RoPE, but every TTS position has three equal axes, and with
equal axes interleaving picks cos/sin values that are identical anyway, so plain 1-D RoPE is exact
(tests/engine/test_model_parity.py checks this against the official function).

Attention reads and writes a static cache (`kv_cache.KVCache`); see `Attention.forward` for the
position rules.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LayerStackConfig


def embedding(num: int, dim: int) -> nn.Embedding:
    """nn.Embedding whose random init is skipped when built on the meta device.

    Weights always come from a checkpoint. On meta, Embedding's normal_ init imports torch._dynamo
    (seconds of load time, and it probes for optional packages), while nn.Linear's init does not.
    """
    if torch.get_default_device().type == "meta":
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))
    return nn.Embedding(num, dim)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention with cuDNN's backend switched off for this call (CUDA inputs).

    On Hopper torch prefers cuDNN attention for bf16, and cuDNN builds a slow execution plan for every new
    shape. A load meets a dozen new shapes (the codec pieces, the prefill buckets), for no speed at these
    sizes over flash or memory-efficient attention, which start at once. The switch is put back after
    the call, so nothing else in the process (other ComfyUI nodes) is affected."""
    if not q.is_cuda or not torch.backends.cuda.cudnn_sdp_enabled():
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x32 * inv_rms).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def _inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """fp32 RoPE frequencies, always computed on the CPU (as upstream does), then put on the default device."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    return (1.0 / (theta ** exponents)).to(torch.get_default_device())


class RotaryEmbedding(nn.Module):
    """1-D rotary embedding: positions [..., L] -> (cos, sin), each [..., L, head_dim] in the requested dtype."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.register_buffer("inv_freq", _inverse_frequencies(head_dim, theta), persistent=False)

    def reset_buffers(self, device) -> None:
        """Recompute the non-persistent frequencies (they are not in checkpoints, e.g. after meta init)."""
        self.inv_freq = _inverse_frequencies(self.head_dim, self.theta).to(device)

    def _apply(self, fn, recurse=True):
        # Device moves apply, dtype casts do not: the angles must come from fp32 frequencies. The buffer
        # is rebuilt (on the CPU, then moved) rather than converted, which also serves a module that was
        # built on the meta device and then moved or `to_empty`-ed.
        old = self._buffers.pop("inv_freq")
        super()._apply(fn, recurse)
        device = fn(torch.empty(0, device=old.device)).device  # a dtype-only cast keeps the buffer's device
        inv_freq = _inverse_frequencies(self.head_dim, self.theta).to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(torch.float32)[..., None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, L, D]; cos/sin [L, D]."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """GQA self-attention with per-head q/k RMSNorm, RoPE and a static KV cache."""

    def __init__(self, cfg: LayerStackConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, start) -> torch.Tensor:
        """x [B, L, H] at positions start..start+L-1 (same for every row).

        Writes this chunk's K/V into k_cache/v_cache [B, kv_heads, max_len, D] at start..start+L-1 and
        attends causally over positions 0..start+L-1 of the cache. `start` may also be a list of one
        position per row (single-token steps of rows with different prompts; cos/sin are then per row).
        """
        b, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, length, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if isinstance(start, list):
            # Rows at different positions: each row attends alone, with the very ops a batch-1 step runs,
            # so a row's numerics never depend on the other rows (the projections are row-independent).
            out = torch.cat([self._attend(q[r:r + 1], k[r:r + 1], v[r:r + 1], cos[r], sin[r],
                                          k_cache[r:r + 1], v_cache[r:r + 1], p) for r, p in enumerate(start)])
        else:
            out = self._attend(q, k, v, cos, sin, k_cache, v_cache, start)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, self.num_heads * self.head_dim))

    def _attend(self, q, k, v, cos, sin, k_cache, v_cache, start: int) -> torch.Tensor:
        length = q.shape[2]
        end = start + length
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        gqa = self.num_heads != self.num_kv_heads
        if start == 0:
            # Fresh prefill: attend over this chunk's own K/V (a plain causal mask).
            out = sdpa(q, k, v, is_causal=length > 1, scale=self.scale, enable_gqa=gqa)
        else:
            keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
            mask = None
            if length > 1:  # chunk appended to an existing prefix: query i sees keys 0..start+i
                rows = torch.arange(start, end, device=q.device)[:, None]
                cols = torch.arange(end, device=q.device)[None, :]
                mask = cols <= rows
            out = sdpa(q, keys, values, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        return out


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 block: x + attn(norm(x)), then + mlp(norm(.))."""

    # Weights the loader lays out as consecutive rows of one tensor (engine/checkpoint/reader.py), which the
    # fused decode steps read as one q/k/v and one gate/up matmul without copying them (gpu/fused_layers.py).
    # Merging after the load freed the originals: ~0.4-0.5 GB of holes the allocator could not give back.
    MERGED_ROWS = (("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
                   ("mlp.gate_proj.weight", "mlp.up_proj.weight"))

    def __init__(self, cfg: LayerStackConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, k_cache, v_cache, start: int):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))

    def _apply(self, fn, recurse=True):
        """Moves and casts drop the layer's fused steps (engine/gpu/fused_layers.py, kept as `_fused`): their
        merged q/k/v and gate/up tensors are the parameters' old storage, and kept they would hold device
        memory after Engine.release() moved the weights to the CPU."""
        self.__dict__.pop("_fused", None)
        return super()._apply(fn, recurse)


class DecoderStack(nn.Module):
    """`layers` + final `norm` + rotary embedding; the `model.` part of the official modules.

    Subclasses add their embeddings under the same parent so state-dict keys match upstream.
    """

    def __init__(self, cfg: LayerStackConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def forward(self, x: torch.Tensor, cache, start) -> torch.Tensor:
        """x [B, L, H] at positions start..start+L-1 -> hidden after the final norm, [B, L, H].
        `start` may be a list of one position per row when L == 1 (rows with different prompts)."""
        if cache.batch != x.shape[0]:
            raise ValueError(f"input batch {x.shape[0]} does not match the KV cache batch {cache.batch}")
        if isinstance(start, list):
            if x.shape[1] != 1 or len(start) != x.shape[0]:
                raise ValueError("per-row positions need single-token steps and one position per row")
            positions = torch.tensor(start, device=x.device)  # row r's cos/sin are row r of the table
        else:
            positions = torch.arange(start, start + x.shape[1], device=x.device)
        cos, sin = self.rotary(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.k[i], cache.v[i], start)
        return self.norm(x)
