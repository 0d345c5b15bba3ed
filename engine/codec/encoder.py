"""Mimi codec encoder: 24 kHz waveform -> 16 codebooks per 12.5 Hz frame (ICL reference codes).

Keys equal those under 'encoder.' in speech_tokenizer/model.safetensors: upstream keeps transformers'
Mimi model minus its decoder parts (upsample, decoder_transformer, decoder), so the file holds
  encoder.layers.*             SEANet convolutional encoder (24 kHz -> 25 Hz, hidden_size channels)
  encoder_transformer.layers.* causal transformer over the 25 Hz frames
  downsample.conv.weight       strided causal conv 25 Hz -> 12.5 Hz (replicate padding, no bias)
  quantizer.{semantic,acoustic}_residual_vector_quantizer.*   split RVQ, every codebook of it
All num_quantizers codebooks are stored (32 in the shipped codec); encode returns the first
`valid_num_quantizers` (16): the semantic codebook, then the first 15 acoustic ones.

Behaviour that fixes the codes (matched exactly against qwen-tts 0.1.1 + transformers 4.57.3):
* Causal convs pad kernel - stride samples on the left (zeros; `pad_mode`) and, on the right, just
  enough to complete the last stride, so every conv maps L samples to ceil(L / stride); T samples
  give ceil(T / 1920) frames, the count upstream keeps.
* The transformer is causal over the whole input; the config's `sliding_window` (250) is NOT applied
  by the upstream code path, so it is ignored here too.
* Nearest codeword by Euclidean distance in float32 (torch.cdist), whatever the module dtype.
* Batches: upstream pads a batch with zeros on the right to the longest item, encodes the padded batch
  and keeps ceil(len_i / 1920) frames per item (`encode_batch`). The last kept frame of a shorter item
  can then differ from encoding it alone; `encode` of one item is the single-item result.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import CheckpointError, InvalidInputError
from ..model.layers import apply_rope, sdpa
from .encoder_config import ACTIVATIONS, MimiEncoderConfig

__all__ = ["MimiEncoder", "MimiEncoderConfig"]


# ----------------------------------------------------------------------------------------------------------
# SEANet convolutional encoder
# ----------------------------------------------------------------------------------------------------------

class _CausalConv(nn.Module):
    """Conv1d whose output frame i sees only input up to (i + 1) * stride - 1; L -> ceil(L / stride)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.left = (kernel - 1) * dilation + 1 - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        right = -(-length // self.stride) * self.stride - length
        if self.pad_mode == "reflect" and length <= max(self.left, right):
            x = F.pad(x, (0, max(self.left, right) - length + 1))  # reflection needs a longer input
            x = F.pad(x, (self.left, right), mode="reflect")[..., : self.left + length + right]
        elif self.pad_mode == "constant":
            x = F.pad(x, (self.left, right))
        else:
            x = F.pad(x, (self.left, right), mode=self.pad_mode)
        return self.conv(x)


class _ResidualUnit(nn.Module):
    """x + conv1x1(elu(conv_k(elu(x)))), the bottleneck being dim // compress channels."""

    def __init__(self, cfg: MimiEncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([
            nn.ELU(),
            _CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation, pad_mode=cfg.pad_mode),
            nn.ELU(),
            _CausalConv(hidden, dim, 1, pad_mode=cfg.pad_mode),
        ])
        self.shortcut = _CausalConv(dim, dim, 1, pad_mode=cfg.pad_mode) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return self.shortcut(x) + y


class _SeanetEncoder(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [_CausalConv(cfg.audio_channels, cfg.num_filters, cfg.kernel_size,
                                               pad_mode=cfg.pad_mode)]
        dim = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            for j in range(cfg.num_residual_layers):
                layers.append(_ResidualUnit(cfg, dim, cfg.dilation_growth_rate ** j))
            layers.append(nn.ELU())
            layers.append(_CausalConv(dim, 2 * dim, 2 * ratio, stride=ratio, pad_mode=cfg.pad_mode))
            dim *= 2
        layers.append(nn.ELU())
        layers.append(_CausalConv(dim, cfg.hidden_size, cfg.last_kernel_size, pad_mode=cfg.pad_mode))
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


# ----------------------------------------------------------------------------------------------------------
# Transformer (pre-norm LayerNorm, RoPE, causal attention, GELU MLP, layer scales)
# ----------------------------------------------------------------------------------------------------------

class _Attention(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = sdpa(q, k, v, is_causal=t > 1)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class _Mlp(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _TransformerLayer(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = _Attention(cfg)
        self.self_attn_layer_scale = _LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = _Mlp(cfg)
        self.mlp_layer_scale = _LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class _Transformer(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta
        self.layers = nn.ModuleList(_TransformerLayer(cfg) for _ in range(cfg.num_layers))

    def rope(self, t: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables [t, head_dim] in float32 (cast to x's dtype), positions 0..t-1."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=x.device).float() / self.head_dim
        inv_freq = 1.0 / (self.theta ** exponents)
        angles = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rope(x.shape[1], x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


# ----------------------------------------------------------------------------------------------------------
# Split residual vector quantizer
# ----------------------------------------------------------------------------------------------------------

class _Codebook(nn.Module):
    """Codewords = embed_sum / max(cluster_usage, 1e-5) (EMA statistics, stored as buffers)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def codewords(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _CodebookHolder(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = _Codebook(size, dim)


class _ResidualVQ(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig, n: int):
        super().__init__()
        self.layers = nn.ModuleList(_CodebookHolder(cfg.codebook_size, cfg.codebook_dim) for _ in range(n))
        self.input_proj = self.output_proj = None
        if cfg.vq_hidden_dim != cfg.hidden_size:
            # output_proj is only used for decoding; it is kept so the checkpoint loads strictly.
            self.input_proj = nn.Conv1d(cfg.hidden_size, cfg.vq_hidden_dim, 1, bias=False)
            self.output_proj = nn.Conv1d(cfg.vq_hidden_dim, cfg.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x [B, hidden, frames] -> codes [n, B, frames] (greedy residual nearest-codeword search)."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        residual = x.transpose(1, 2)  # [B, frames, D]
        codes = []
        for holder in self.layers[:n]:
            words = holder.codebook.codewords()
            flat = residual.reshape(-1, residual.shape[-1])
            idx = torch.cdist(flat[None].float(), words[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(residual.shape[:-1])
            residual = residual - F.embedding(idx, words)
            codes.append(idx)
        return torch.stack(codes)


class _SplitResidualVQ(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.n_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = _ResidualVQ(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = _ResidualVQ(cfg, cfg.num_quantizers - cfg.num_semantic_quantizers)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            acoustic = self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)
            codes = torch.cat([codes, acoustic], dim=0)
        return codes


# ----------------------------------------------------------------------------------------------------------
# The encoder
# ----------------------------------------------------------------------------------------------------------

class MimiEncoder(nn.Module):
    def __init__(self, encoder_config: dict, valid_num_quantizers: int = 16):
        super().__init__()
        cfg = MimiEncoderConfig.from_dict(encoder_config)
        if not cfg.num_semantic_quantizers <= valid_num_quantizers <= cfg.num_quantizers:
            raise CheckpointError(
                f"encoder_valid_num_quantizers {valid_num_quantizers} must lie between num_semantic_quantizers "
                f"({cfg.num_semantic_quantizers}) and num_quantizers ({cfg.num_quantizers})."
            )
        self.cfg = cfg
        self.valid_num_quantizers = int(valid_num_quantizers)
        self.encoder = _SeanetEncoder(cfg)
        self.encoder_transformer = _Transformer(cfg)
        self.downsample = _CausalConv(cfg.hidden_size, cfg.hidden_size, 4, stride=2, bias=False, pad_mode="replicate")
        self.quantizer = _SplitResidualVQ(cfg)

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.samples_per_frame

    def num_frames(self, num_samples: int) -> int:
        """Frames returned for num_samples samples of 24 kHz audio: ceil(num_samples / 1920)."""
        return -(-int(num_samples) // self.samples_per_frame)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, T] (zero-padded batch) -> codes [B, valid_num_quantizers, ceil(T / 1920)]."""
        p = next(self.parameters())
        x = wav.to(device=p.device, dtype=p.dtype)[:, None]
        x = self.encoder(x)
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        x = self.downsample(x)
        return self.quantizer.encode(x, self.valid_num_quantizers).transpose(0, 1)

    def _check(self, wav: torch.Tensor) -> None:
        if not isinstance(wav, torch.Tensor) or wav.ndim not in (1, 2) or wav.shape[-1] == 0:
            shape = tuple(wav.shape) if isinstance(wav, torch.Tensor) else type(wav).__name__
            raise InvalidInputError(f"MimiEncoder expects a 24 kHz mono waveform [T] or [B, T]; got {shape}.")
        if not torch.isfinite(wav).all():
            raise InvalidInputError("the reference audio contains NaN or Inf samples; re-export it.")

    @torch.inference_mode()
    def encode(self, wav24k: torch.Tensor) -> torch.Tensor:
        """wav [B, T] (every row T real samples) -> LongTensor [B, ceil(T / 1920), Q]; [T] -> [frames, Q].

        Q = valid_num_quantizers (16). Codes come back on the module's device.
        """
        self._check(wav24k)
        single = wav24k.ndim == 1
        codes = self(wav24k[None] if single else wav24k).transpose(1, 2).contiguous()
        return codes[0] if single else codes

    @torch.inference_mode()
    def encode_batch(self, wavs: list) -> list:
        """Upstream's batched path: zero-pad to the longest item, encode once, keep ceil(len / 1920) frames.

        wavs: list of mono 24 kHz [T_i] tensors -> list of LongTensor [frames_i, Q].
        """
        if not wavs:
            return []
        for w in wavs:
            self._check(w)
            if w.ndim != 1:
                raise InvalidInputError("encode_batch expects a list of mono [T] waveforms.")
        longest = max(int(w.shape[-1]) for w in wavs)
        batch = torch.stack([F.pad(w.to(torch.float32), (0, longest - w.shape[-1])) for w in wavs])
        codes = self(batch).transpose(1, 2)
        return [codes[i, : self.num_frames(w.shape[-1])].contiguous() for i, w in enumerate(wavs)]
