"""`speech_tokenizer/config.json` of the 12 Hz codec, parsed into frozen dataclasses.

Every number the decoder needs is read from the file; a missing key raises CheckpointError naming the
file and the key. The encoder part is kept as the raw dict (`CodecConfig.encoder`); the encoder's own
parser builds on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import read_json, require
from ..errors import CheckpointError


@dataclass(frozen=True)
class DecoderConfig:
    """The codec decoder (codes -> 24 kHz waveform): `decoder_config` of speech_tokenizer/config.json."""

    num_quantizers: int  # codebooks per frame (16)
    codebook_size: int  # entries per codebook (2048)
    codebook_dim: int  # width of the summed code vectors (512); each codebook stores codebook_dim // 2
    latent_dim: int  # width around the transformer and of the two upsampling stages (1024)
    decoder_dim: int  # width entering the first waveform block (1536); halves each block
    hidden_size: int  # transformer width (512)
    intermediate_size: int  # transformer MLP width (1024)
    num_layers: int  # transformer layers (8)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int  # a position attends to itself and the previous sliding_window - 1 positions
    rope_theta: float
    rms_norm_eps: float
    layer_scale_initial_scale: float
    attention_bias: bool
    hidden_act: str
    upsampling_ratios: tuple  # transposed-conv + ConvNeXt stages on the latent (2, 2)
    upsample_rates: tuple  # waveform blocks (8, 5, 4, 3)
    num_semantic_quantizers: int = 1

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in (*self.upsampling_ratios, *self.upsample_rates):
            n *= int(r)
        return n

    @classmethod
    def from_dict(cls, d: dict, where: str) -> DecoderConfig:
        hidden = int(require(d, "hidden_size", where))
        heads = int(require(d, "num_attention_heads", where))
        cfg = cls(
            num_quantizers=int(require(d, "num_quantizers", where)),
            codebook_size=int(require(d, "codebook_size", where)),
            codebook_dim=int(require(d, "codebook_dim", where)),
            latent_dim=int(require(d, "latent_dim", where)),
            decoder_dim=int(require(d, "decoder_dim", where)),
            hidden_size=hidden,
            intermediate_size=int(require(d, "intermediate_size", where)),
            num_layers=int(require(d, "num_hidden_layers", where)),
            num_heads=heads,
            num_kv_heads=int(require(d, "num_key_value_heads", where)),
            head_dim=int(d.get("head_dim") or hidden // heads),
            sliding_window=int(require(d, "sliding_window", where)),
            rope_theta=float(require(d, "rope_theta", where)),
            rms_norm_eps=float(require(d, "rms_norm_eps", where)),
            layer_scale_initial_scale=float(d.get("layer_scale_initial_scale", 0.01)),
            attention_bias=bool(d.get("attention_bias", False)),
            hidden_act=str(d.get("hidden_act", "silu")),
            upsampling_ratios=tuple(int(x) for x in require(d, "upsampling_ratios", where)),
            upsample_rates=tuple(int(x) for x in require(d, "upsample_rates", where)),
            num_semantic_quantizers=int(d.get("num_semantic_quantizers", 1)),
        )
        if cfg.hidden_act != "silu":
            raise CheckpointError(f"{where}: hidden_act '{cfg.hidden_act}' is not supported (only 'silu' ships).")
        if cfg.num_semantic_quantizers != 1 or cfg.num_quantizers < 2:
            raise CheckpointError(
                f"{where}: expected 1 semantic quantizer and at least 2 quantizers, got "
                f"{cfg.num_semantic_quantizers} and {cfg.num_quantizers}."
            )
        if cfg.num_heads % cfg.num_kv_heads or cfg.codebook_dim % 2 or cfg.decoder_dim % 2 ** len(cfg.upsample_rates):
            raise CheckpointError(f"{where}: inconsistent widths (heads, codebook_dim or decoder_dim).")
        return cfg


@dataclass(frozen=True)
class CodecConfig:
    """speech_tokenizer/config.json: rates, the parsed decoder config and the raw encoder config."""

    input_sample_rate: int
    output_sample_rate: int
    decode_upsample_rate: int  # samples per frame out of the decoder (1920)
    encode_downsample_rate: int
    encoder_valid_num_quantizers: int
    decoder: DecoderConfig
    encoder: dict = field(default_factory=dict, compare=False)  # raw encoder_config (MimiConfig layout)

    @classmethod
    def from_dict(cls, d: dict, where: str = "speech_tokenizer/config.json") -> CodecConfig:
        dec = DecoderConfig.from_dict(require(d, "decoder_config", where), where + " → decoder_config")
        cfg = cls(
            input_sample_rate=int(require(d, "input_sample_rate", where)),
            output_sample_rate=int(require(d, "output_sample_rate", where)),
            decode_upsample_rate=int(require(d, "decode_upsample_rate", where)),
            encode_downsample_rate=int(require(d, "encode_downsample_rate", where)),
            encoder_valid_num_quantizers=int(require(d, "encoder_valid_num_quantizers", where)),
            decoder=dec,
            encoder=dict(d.get("encoder_config") or {}),
        )
        if dec.samples_per_frame != cfg.decode_upsample_rate:
            raise CheckpointError(
                f"{where}: decode_upsample_rate {cfg.decode_upsample_rate} does not match the decoder's "
                f"upsampling product {dec.samples_per_frame} (upsampling_ratios × upsample_rates)."
            )
        return cfg

    @classmethod
    def from_file(cls, path: Path) -> CodecConfig:
        return cls.from_dict(read_json(Path(path)), str(path))

    @classmethod
    def from_dir(cls, model_dir: Path) -> CodecConfig:
        """Read `<model_dir>/speech_tokenizer/config.json` of a Qwen3-TTS-12Hz checkpoint directory."""
        return cls.from_file(Path(model_dir) / "speech_tokenizer" / "config.json")
