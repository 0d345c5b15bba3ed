"""`speech_tokenizer/config.json` of the 12 Hz codec, parsed into frozen dataclasses.

Every number the decoder needs is read from the file; a missing key raises CheckpointError naming the
file and the key. The encoder part is kept as the raw dict (`CodecConfig.encoder`); the encoder's own
parser builds on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import config_fields as cf
from ..config import SAMPLE_RATE, SAMPLES_PER_FRAME, read_json
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
        hidden, heads, kv_heads, head_dim = cf.attention_shape(d, where)
        codebook_dim = cf.whole(d, "codebook_dim", where)
        if codebook_dim % 2:  # each of the two codebook groups stores half of it
            raise cf.fail(where, "codebook_dim", "an even number", codebook_dim)
        upsample_rates = cf.whole_list(d, "upsample_rates", where, hi=cf.MAX_COUNT)
        decoder_dim = cf.whole(d, "decoder_dim", where)
        if decoder_dim % 2 ** len(upsample_rates):  # each waveform block halves the width
            raise cf.fail(where, "decoder_dim", f"a multiple of {2 ** len(upsample_rates)} (it halves at each of "
                                                "the upsample_rates)", decoder_dim)
        cfg = cls(
            num_quantizers=cf.whole(d, "num_quantizers", where, lo=2, hi=cf.MAX_COUNT),
            codebook_size=cf.whole(d, "codebook_size", where),
            codebook_dim=codebook_dim,
            latent_dim=cf.whole(d, "latent_dim", where),
            decoder_dim=decoder_dim,
            hidden_size=hidden,
            intermediate_size=cf.whole(d, "intermediate_size", where),
            num_layers=cf.whole(d, "num_hidden_layers", where, hi=cf.MAX_COUNT),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            sliding_window=cf.whole(d, "sliding_window", where),
            rope_theta=cf.real(d, "rope_theta", where, 1.0, 1e12),
            rms_norm_eps=cf.real(d, "rms_norm_eps", where, 0.0, 1.0, lo_open=True),
            layer_scale_initial_scale=cf.real(d, "layer_scale_initial_scale", where, -1e6, 1e6, default=0.01),
            attention_bias=cf.flag(d, "attention_bias", where, default=False),
            hidden_act=cf.text(d, "hidden_act", where, ("silu",), default="silu"),
            upsampling_ratios=cf.whole_list(d, "upsampling_ratios", where, hi=cf.MAX_COUNT),
            upsample_rates=upsample_rates,
            num_semantic_quantizers=cf.whole(d, "num_semantic_quantizers", where, lo=1, hi=1, default=1),
        )
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
        if not isinstance(d, dict):
            raise CheckpointError(f"{where} must hold a JSON object. {cf.FIX}")
        dec = DecoderConfig.from_dict(cf.section(d, "decoder_config", where), where + " → decoder_config")
        rate = lambda key: cf.whole(d, key, where, lo=SAMPLE_RATE, hi=SAMPLE_RATE)
        cfg = cls(
            input_sample_rate=rate("input_sample_rate"),
            output_sample_rate=rate("output_sample_rate"),
            decode_upsample_rate=cf.whole(d, "decode_upsample_rate", where, lo=SAMPLES_PER_FRAME, hi=SAMPLES_PER_FRAME),
            encode_downsample_rate=cf.whole(d, "encode_downsample_rate", where, lo=SAMPLES_PER_FRAME,
                                            hi=SAMPLES_PER_FRAME),
            encoder_valid_num_quantizers=cf.whole(d, "encoder_valid_num_quantizers", where, hi=dec.num_quantizers),
            decoder=dec,
            encoder=dict(cf.section(d, "encoder_config", where, default={}) or {}),
        )
        if dec.samples_per_frame != cfg.decode_upsample_rate:
            raise CheckpointError(
                f"{where}: fields 'decoder_config.upsampling_ratios' and 'decoder_config.upsample_rates' multiply "
                f"to {dec.samples_per_frame} samples a frame, but decode_upsample_rate is "
                f"{cfg.decode_upsample_rate}. {cf.FIX}"
            )
        return cfg

    @classmethod
    def from_file(cls, path: Path) -> CodecConfig:
        return cls.from_dict(read_json(Path(path)), str(path))

    @classmethod
    def from_dir(cls, model_dir: Path) -> CodecConfig:
        """Read `<model_dir>/speech_tokenizer/config.json` of a Qwen3-TTS-12Hz checkpoint directory."""
        return cls.from_file(Path(model_dir) / "speech_tokenizer" / "config.json")
