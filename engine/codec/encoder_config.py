"""`encoder_config` of speech_tokenizer/config.json, parsed for the Mimi encoder (engine/codec/encoder.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch.nn import functional as F

from ..config import require
from ..errors import CheckpointError

WHERE = "speech_tokenizer/config.json → encoder_config"


@dataclass(frozen=True)
class MimiEncoderConfig:
    """The fields of `encoder_config` (MimiConfig layout) that shape the encoder."""

    audio_channels: int
    num_filters: int
    kernel_size: int
    residual_kernel_size: int
    last_kernel_size: int
    num_residual_layers: int
    dilation_growth_rate: int
    compress: int
    upsampling_ratios: tuple  # listed decoder-first; the encoder applies them reversed
    pad_mode: str
    use_conv_shortcut: bool
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    norm_eps: float
    rope_theta: float
    attention_bias: bool
    num_quantizers: int
    num_semantic_quantizers: int
    codebook_size: int
    codebook_dim: int
    vq_hidden_dim: int
    sampling_rate: int
    frame_rate: float

    @classmethod
    def from_dict(cls, d: dict) -> "MimiEncoderConfig":
        hidden = int(require(d, "hidden_size", WHERE))
        heads = int(require(d, "num_attention_heads", WHERE))
        cfg = cls(
            audio_channels=int(d.get("audio_channels", 1)),
            num_filters=int(require(d, "num_filters", WHERE)),
            kernel_size=int(require(d, "kernel_size", WHERE)),
            residual_kernel_size=int(require(d, "residual_kernel_size", WHERE)),
            last_kernel_size=int(require(d, "last_kernel_size", WHERE)),
            num_residual_layers=int(require(d, "num_residual_layers", WHERE)),
            dilation_growth_rate=int(require(d, "dilation_growth_rate", WHERE)),
            compress=int(require(d, "compress", WHERE)),
            upsampling_ratios=tuple(int(r) for r in require(d, "upsampling_ratios", WHERE)),
            pad_mode=str(d.get("pad_mode", "constant")),
            use_conv_shortcut=bool(d.get("use_conv_shortcut", False)),
            hidden_size=hidden,
            num_layers=int(require(d, "num_hidden_layers", WHERE)),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            intermediate_size=int(require(d, "intermediate_size", WHERE)),
            hidden_act=str(d.get("hidden_act", "gelu")),
            norm_eps=float(d.get("norm_eps", 1e-5)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            attention_bias=bool(d.get("attention_bias", False)),
            num_quantizers=int(require(d, "num_quantizers", WHERE)),
            num_semantic_quantizers=int(d.get("num_semantic_quantizers", 1)),
            codebook_size=int(require(d, "codebook_size", WHERE)),
            codebook_dim=int(require(d, "codebook_dim", WHERE)),
            vq_hidden_dim=int(d.get("vector_quantization_hidden_dimension") or require(d, "codebook_dim", WHERE)),
            sampling_rate=int(d.get("sampling_rate", 24000)),
            frame_rate=float(require(d, "frame_rate", WHERE)),
        )
        if not d.get("use_causal_conv", True):
            raise CheckpointError(f"{WHERE}: use_causal_conv false is not supported (the shipped codec is causal).")
        if cfg.hidden_act not in ACTIVATIONS:
            raise CheckpointError(f"{WHERE}: hidden_act '{cfg.hidden_act}' is not supported ({', '.join(ACTIVATIONS)}).")
        if cfg.pad_mode not in ("constant", "replicate", "reflect"):
            raise CheckpointError(f"{WHERE}: pad_mode '{cfg.pad_mode}' is not supported.")
        if cfg.num_heads % cfg.num_kv_heads:
            raise CheckpointError(f"{WHERE}: num_attention_heads must be a multiple of num_key_value_heads.")
        if abs(cfg.encoder_rate / cfg.frame_rate - 2.0) > 1e-9:
            raise CheckpointError(
                f"{WHERE}: expected the conv encoder rate ({cfg.encoder_rate:g} Hz) to be twice frame_rate "
                f"({cfg.frame_rate:g} Hz), as in the shipped 12 Hz codec."
            )
        return cfg

    @property
    def encoder_rate(self) -> float:
        """Frame rate after the SEANet convs (25 Hz), before the final stride-2 downsample."""
        return self.sampling_rate / math.prod(self.upsampling_ratios)

    @property
    def samples_per_frame(self) -> int:
        return 2 * math.prod(self.upsampling_ratios)


ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
