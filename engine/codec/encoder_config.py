"""`encoder_config` of speech_tokenizer/config.json, parsed for the Mimi encoder (engine/codec/encoder.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch.nn import functional as F

from .. import config_fields as cf
from ..config import SAMPLE_RATE
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
    def from_dict(cls, d: dict) -> MimiEncoderConfig:
        if not isinstance(d, dict):
            raise cf.fail("speech_tokenizer/config.json", "encoder_config", "a JSON object", d)
        small = lambda key, hi=cf.MAX_COUNT, **kw: cf.whole(d, key, WHERE, hi=hi, **kw)
        hidden = cf.whole(d, "hidden_size", WHERE)
        heads = small("num_attention_heads")
        head_dim = cf.whole(d, "head_dim", WHERE, default=hidden // heads, null_default=True)
        if head_dim % 2:  # rotary embeddings turn pairs of channels
            raise cf.fail(WHERE, "head_dim", "an even number", head_dim)
        codebook_dim = cf.whole(d, "codebook_dim", WHERE)
        num_quantizers = small("num_quantizers", lo=2)
        cfg = cls(
            audio_channels=small("audio_channels", lo=1, hi=1, default=1),
            num_filters=cf.whole(d, "num_filters", WHERE),
            kernel_size=small("kernel_size"),
            residual_kernel_size=small("residual_kernel_size"),
            last_kernel_size=small("last_kernel_size"),
            num_residual_layers=small("num_residual_layers"),
            dilation_growth_rate=small("dilation_growth_rate"),
            compress=small("compress"),
            upsampling_ratios=cf.whole_list(d, "upsampling_ratios", WHERE, hi=cf.MAX_COUNT),
            pad_mode=cf.text(d, "pad_mode", WHERE, ("constant", "replicate", "reflect"), default="constant"),
            use_conv_shortcut=cf.flag(d, "use_conv_shortcut", WHERE, default=False),
            hidden_size=hidden,
            num_layers=small("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=small("num_key_value_heads", default=heads, null_default=True),
            head_dim=head_dim,
            intermediate_size=cf.whole(d, "intermediate_size", WHERE),
            hidden_act=cf.text(d, "hidden_act", WHERE, tuple(ACTIVATIONS), default="gelu"),
            norm_eps=cf.real(d, "norm_eps", WHERE, 0.0, 1.0, lo_open=True, default=1e-5),
            rope_theta=cf.real(d, "rope_theta", WHERE, 1.0, 1e12, default=10000.0),
            attention_bias=cf.flag(d, "attention_bias", WHERE, default=False),
            num_quantizers=num_quantizers,
            num_semantic_quantizers=small("num_semantic_quantizers", hi=num_quantizers - 1, default=1),
            codebook_size=cf.whole(d, "codebook_size", WHERE),
            codebook_dim=codebook_dim,
            vq_hidden_dim=cf.whole(d, "vector_quantization_hidden_dimension", WHERE, default=codebook_dim,
                                   null_default=True),
            sampling_rate=cf.whole(d, "sampling_rate", WHERE, lo=SAMPLE_RATE, hi=SAMPLE_RATE, default=SAMPLE_RATE),
            frame_rate=cf.real(d, "frame_rate", WHERE, 0.0, SAMPLE_RATE, lo_open=True),
        )
        if not cf.flag(d, "use_causal_conv", WHERE, default=True):
            raise CheckpointError(f"{WHERE}: use_causal_conv false is not supported (the shipped codec is causal).")
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
