"""Checkpoint configuration: `config.json` and `generation_config.json` parsed into frozen dataclasses.

Numbers are always read from the files, never from defaults: the upstream config classes carry
defaults that match no released checkpoint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import config_fields as cf
from .errors import CheckpointError

MODEL_TYPES = ("base", "custom_voice", "voice_design")
FAMILY = "qwen3-tts-12hz"
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
CONTROL_IDS = 1024  # talker ids after the audio codes: pad, bos, eos, think tags, languages, speakers
SPEAKER_MELS = 128  # log-mel bands the speaker encoder reads (model/mel.py)


_LAYOUT_HINT = ("A Qwen3-TTS-12Hz checkpoint directory holds config.json, generation_config.json, "
                "model.safetensors, vocab.json, merges.txt, tokenizer_config.json, preprocessor_config.json and "
                "speech_tokenizer/; copy the whole directory as published.")


def read_json(path: Path, what: str = "file", hint: str = _LAYOUT_HINT) -> dict:
    """Read a JSON object, turning a missing or malformed file into a CheckpointError naming it."""
    if not path.is_file():
        raise CheckpointError(f"missing {what} {path}. {hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"cannot read {path} ({exc.strerror or exc}); check its permissions. {hint}") from exc
    except ValueError as exc:  # not JSON, not UTF-8, or a number of more digits than Python converts
        raise CheckpointError(f"{path} is not valid JSON ({exc}); re-download that file. {hint}") from exc
    except RecursionError as exc:  # the parser recurses once per nesting level
        raise CheckpointError(f"{path} is nested too deeply to be a config; re-download that file. {hint}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object; re-download that file. {hint}")
    return data


def require(d: dict, key: str, where: str) -> Any:
    """Fetch a key that must be present, with an error that names the file and key."""
    if not isinstance(d, dict) or key not in d:
        raise CheckpointError(f"missing key '{key}' in {where}; the file is incomplete or not a Qwen3-TTS-12Hz config.")
    return d[key]


@dataclass(frozen=True)
class LayerStackConfig:
    """A stack of Qwen3 decoder layers (used by both the talker and the code predictor)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> LayerStackConfig:
        hidden, heads, kv_heads, head_dim = cf.attention_shape(d, where)
        cf.text(d, "hidden_act", where, ("silu",), default="silu")  # the MLP is SwiGLU: silu is built in
        return cls(
            hidden_size=hidden,
            intermediate_size=cf.whole(d, "intermediate_size", where),
            num_layers=cf.whole(d, "num_hidden_layers", where, hi=cf.MAX_COUNT),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=cf.real(d, "rms_norm_eps", where, 0.0, 1.0, lo_open=True, default=1e-6),
            rope_theta=cf.real(d, "rope_theta", where, 1.0, 1e12, default=1e6),
            max_position_embeddings=cf.whole(d, "max_position_embeddings", where, default=32768),
            vocab_size=cf.whole(d, "vocab_size", where),
        )


@dataclass(frozen=True)
class TalkerConfig:
    layers: LayerStackConfig
    predictor: LayerStackConfig
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    language_ids: dict = field(default_factory=dict)  # lower-case name -> codec id
    speaker_ids: dict = field(default_factory=dict)  # lower-case name -> codec id
    speaker_dialect: dict = field(default_factory=dict)  # lower-case name -> dialect language or False

    @property
    def hidden_size(self) -> int:
        return self.layers.hidden_size

    @classmethod
    def from_dict(cls, d: dict, where: str) -> TalkerConfig:
        layers = LayerStackConfig.from_dict(d, where)
        predictor = LayerStackConfig.from_dict(cf.section(d, "code_predictor_config", where),
                                               where + " → code_predictor_config")
        vocab = layers.vocab_size
        # Codebook 0 shares the talker's vocabulary with 1024 control ids after the audio codes (sampling masks
        # them by position), so the audio codes must be exactly the code predictor's (and the codec's) entries.
        if vocab != predictor.vocab_size + CONTROL_IDS:
            raise cf.fail(where, "vocab_size", f"code_predictor_config.vocab_size + {CONTROL_IDS} "
                                              f"({predictor.vocab_size + CONTROL_IDS})", vocab)
        codec_id = lambda key: cf.token_id(d, key, where, vocab, "vocab_size")
        languages = cf.id_map(d, "codec_language_id", where, 0, vocab)
        speakers = cf.id_map(d, "spk_id", where, 0, vocab)
        return cls(
            layers=layers,
            predictor=predictor,
            text_vocab_size=cf.whole(d, "text_vocab_size", where),
            text_hidden_size=cf.whole(d, "text_hidden_size", where),
            num_code_groups=cf.whole(d, "num_code_groups", where, lo=2, hi=cf.MAX_COUNT),
            codec_pad_id=codec_id("codec_pad_id"),
            codec_bos_id=codec_id("codec_bos_id"),
            codec_eos_id=codec_id("codec_eos_token_id"),
            codec_think_id=codec_id("codec_think_id"),
            codec_nothink_id=codec_id("codec_nothink_id"),
            codec_think_bos_id=codec_id("codec_think_bos_id"),
            codec_think_eos_id=codec_id("codec_think_eos_id"),
            language_ids=languages,
            speaker_ids=speakers,
            speaker_dialect=_dialects(d, where, languages),
        )


def _dialects(d: dict, where: str, languages: dict) -> dict:
    """spk_is_dialect: {lower-case speaker: false, or the lower-case name of one of codec_language_id}."""
    value = d.get("spk_is_dialect")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise cf.fail(where, "spk_is_dialect", "a JSON object of speaker names to false or a dialect", value)
    out = {}
    for name, dialect in value.items():
        if dialect is None or dialect is False:
            out[name.lower()] = False
        elif isinstance(dialect, str) and dialect.lower() in languages:
            out[name.lower()] = dialect.lower()
        else:
            raise cf.fail(where, f"spk_is_dialect.{name}", "false or a language of codec_language_id", dialect)
    return out


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int
    enc_dim: int
    enc_channels: tuple
    enc_kernel_sizes: tuple
    enc_dilations: tuple
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int
    sample_rate: int

    @classmethod
    def from_dict(cls, d: dict, where: str = "speaker_encoder_config") -> SpeakerEncoderConfig:
        # The published files list only enc_dim and sample_rate; the rest are the code's constants.
        channels = cf.whole_list(d, "enc_channels", where, default=(512, 512, 512, 512, 1536))
        n = len(channels)
        if n < 3:
            raise cf.fail(where, "enc_channels", "a list of at least 3 widths", list(channels))
        scale = cf.whole(d, "enc_res2net_scale", where, hi=cf.MAX_COUNT, default=8)
        if any(c % scale for c in channels[1:-1]):
            raise cf.fail(where, "enc_res2net_scale", f"a divisor of every inner width of enc_channels "
                                                     f"{list(channels)}", scale)
        return cls(
            mel_dim=cf.whole(d, "mel_dim", where, lo=SPEAKER_MELS, hi=SPEAKER_MELS, default=SPEAKER_MELS),
            enc_dim=cf.whole(d, "enc_dim", where, default=1024),
            enc_channels=channels,
            enc_kernel_sizes=cf.whole_list(d, "enc_kernel_sizes", where, hi=cf.MAX_COUNT, length=n,
                                          default=(5, 3, 3, 3, 1)),
            enc_dilations=cf.whole_list(d, "enc_dilations", where, hi=cf.MAX_COUNT, length=n, default=(1, 2, 3, 4, 1)),
            enc_attention_channels=cf.whole(d, "enc_attention_channels", where, default=128),
            enc_res2net_scale=scale,
            enc_se_channels=cf.whole(d, "enc_se_channels", where, default=128),
            sample_rate=cf.whole(d, "sample_rate", where, lo=SAMPLE_RATE, hi=SAMPLE_RATE, default=SAMPLE_RATE),
        )


@dataclass(frozen=True)
class ModelConfig:
    """The top-level `config.json` of a Qwen3-TTS-12Hz checkpoint."""

    tts_model_type: str
    tts_model_size: str
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None  # built only for Base checkpoints

    @property
    def instruct_ignored(self) -> bool:
        """Upstream drops instruct on CustomVoice when the size is a substring of '0b6'."""
        return self.tts_model_type == "custom_voice" and self.tts_model_size in "0b6"

    @property
    def embedding_width(self) -> int:
        """Width of a speaker embedding for this model (1024 for 0.6B, 2048 for 1.7B)."""
        return self.talker.hidden_size

    @property
    def supported_languages(self) -> list[str]:
        return ["auto"] + sorted(k for k in self.talker.language_ids if "dialect" not in k)

    @property
    def supported_speakers(self) -> list[str]:
        return sorted(self.talker.speaker_ids)

    @classmethod
    def from_dict(cls, d: dict, where: str = "config.json") -> ModelConfig:
        if not isinstance(d, dict):
            raise CheckpointError(f"{where} must hold a JSON object. {cf.FIX}")
        mtype = require(d, "tts_model_type", where)
        if not isinstance(mtype, str) or mtype not in MODEL_TYPES:
            raise CheckpointError(
                f"{where}: field 'tts_model_type' is {cf.shown(mtype)}, not one of {', '.join(MODEL_TYPES)}. Only the "
                "Qwen3-TTS-12Hz Base, CustomVoice and VoiceDesign checkpoints are supported; use one of those, "
                "downloaded whole.")
        talker = TalkerConfig.from_dict(cf.section(d, "talker_config", where), where + " → talker_config")
        if mtype == "custom_voice" and not talker.speaker_ids:
            raise cf.fail(where + " → talker_config", "spk_id", "an object of at least one speaker name and id (a "
                                                               "CustomVoice checkpoint speaks only as its speakers)",
                          d["talker_config"].get("spk_id"))
        spk = None
        if mtype == "base":
            section = where + " → speaker_encoder_config"
            spk = SpeakerEncoderConfig.from_dict(cf.section(d, "speaker_encoder_config", where), section)
            if spk.enc_dim != talker.hidden_size:  # the x-vector fills one talker position
                raise cf.fail(section, "enc_dim", f"the talker's hidden_size ({talker.hidden_size})", spk.enc_dim)
        size = d.get("tts_model_size")
        if size is not None and not isinstance(size, str):
            raise cf.fail(where, "tts_model_size", "a string such as \"0b6\" or \"1b7\"", size)
        text_id = lambda key: cf.token_id(d, key, where, talker.text_vocab_size, "talker_config.text_vocab_size")
        return cls(
            tts_model_type=mtype,
            tts_model_size=size or "",
            im_start_token_id=text_id("im_start_token_id"),
            im_end_token_id=text_id("im_end_token_id"),
            tts_pad_token_id=text_id("tts_pad_token_id"),
            tts_bos_token_id=text_id("tts_bos_token_id"),
            tts_eos_token_id=text_id("tts_eos_token_id"),
            talker=talker,
            speaker_encoder=spk,
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        return cls.from_dict(read_json(path), str(path))


def read_generation_config(model_dir: Path) -> dict:
    """generation_config.json (required by upstream too): the checkpoint's sampling defaults."""
    return read_json(Path(model_dir) / "generation_config.json")
