"""Checkpoint configuration: `config.json` and `generation_config.json` parsed into frozen dataclasses.

Numbers are always read from the files, never from defaults: the upstream config classes carry
defaults that match no released checkpoint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError

MODEL_TYPES = ("base", "custom_voice", "voice_design")
FAMILY = "qwen3-tts-12hz"
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920


_LAYOUT_HINT = ("A Qwen3-TTS-12Hz checkpoint directory holds config.json, generation_config.json, "
                "model.safetensors, vocab.json, merges.txt, tokenizer_config.json, preprocessor_config.json and "
                "speech_tokenizer/; copy the whole directory as published.")


def read_json(path: Path, what: str = "file", hint: str = _LAYOUT_HINT) -> dict:
    """Read a JSON object, turning a missing or malformed file into a CheckpointError naming it."""
    if not path.is_file():
        raise CheckpointError(f"missing {what} {path}. {hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); re-download that file. {hint}") from exc
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
    def from_dict(cls, d: dict, where: str) -> "LayerStackConfig":
        return cls(
            hidden_size=int(require(d, "hidden_size", where)),
            intermediate_size=int(require(d, "intermediate_size", where)),
            num_layers=int(require(d, "num_hidden_layers", where)),
            num_heads=int(require(d, "num_attention_heads", where)),
            num_kv_heads=int(require(d, "num_key_value_heads", where)),
            head_dim=int(d.get("head_dim") or int(require(d, "hidden_size", where)) // int(d["num_attention_heads"])),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(d.get("rope_theta", 1e6)),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            vocab_size=int(require(d, "vocab_size", where)),
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
    def from_dict(cls, d: dict, where: str) -> "TalkerConfig":
        pred = require(d, "code_predictor_config", where)
        lower = lambda m: {str(k).lower(): v for k, v in (m or {}).items()}  # noqa: E731
        return cls(
            layers=LayerStackConfig.from_dict(d, where),
            predictor=LayerStackConfig.from_dict(pred, where + " → code_predictor_config"),
            text_vocab_size=int(require(d, "text_vocab_size", where)),
            text_hidden_size=int(require(d, "text_hidden_size", where)),
            num_code_groups=int(require(d, "num_code_groups", where)),
            codec_pad_id=int(require(d, "codec_pad_id", where)),
            codec_bos_id=int(require(d, "codec_bos_id", where)),
            codec_eos_id=int(require(d, "codec_eos_token_id", where)),
            codec_think_id=int(require(d, "codec_think_id", where)),
            codec_nothink_id=int(require(d, "codec_nothink_id", where)),
            codec_think_bos_id=int(require(d, "codec_think_bos_id", where)),
            codec_think_eos_id=int(require(d, "codec_think_eos_id", where)),
            language_ids=lower(d.get("codec_language_id")),
            speaker_ids=lower(d.get("spk_id")),
            speaker_dialect=lower(d.get("spk_is_dialect")),
        )


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
    def from_dict(cls, d: dict) -> "SpeakerEncoderConfig":
        # The published files list only enc_dim and sample_rate; the rest are the code's constants.
        return cls(
            mel_dim=int(d.get("mel_dim", 128)),
            enc_dim=int(d.get("enc_dim", 1024)),
            enc_channels=tuple(d.get("enc_channels", (512, 512, 512, 512, 1536))),
            enc_kernel_sizes=tuple(d.get("enc_kernel_sizes", (5, 3, 3, 3, 1))),
            enc_dilations=tuple(d.get("enc_dilations", (1, 2, 3, 4, 1))),
            enc_attention_channels=int(d.get("enc_attention_channels", 128)),
            enc_res2net_scale=int(d.get("enc_res2net_scale", 8)),
            enc_se_channels=int(d.get("enc_se_channels", 128)),
            sample_rate=int(d.get("sample_rate", SAMPLE_RATE)),
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
    def from_dict(cls, d: dict, where: str = "config.json") -> "ModelConfig":
        mtype = require(d, "tts_model_type", where)
        if mtype not in MODEL_TYPES:
            raise CheckpointError(
                f"unknown tts_model_type '{mtype}' in {where}; expected one of {', '.join(MODEL_TYPES)}. "
                "Only the Qwen3-TTS-12Hz Base, CustomVoice and VoiceDesign checkpoints are supported."
            )
        talker = TalkerConfig.from_dict(require(d, "talker_config", where), where + " → talker_config")
        spk = None
        if mtype == "base":
            spk = SpeakerEncoderConfig.from_dict(require(d, "speaker_encoder_config", where))
        return cls(
            tts_model_type=mtype,
            tts_model_size=str(d.get("tts_model_size") or ""),
            im_start_token_id=int(require(d, "im_start_token_id", where)),
            im_end_token_id=int(require(d, "im_end_token_id", where)),
            tts_pad_token_id=int(require(d, "tts_pad_token_id", where)),
            tts_bos_token_id=int(require(d, "tts_bos_token_id", where)),
            tts_eos_token_id=int(require(d, "tts_eos_token_id", where)),
            talker=talker,
            speaker_encoder=spk,
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        return cls.from_dict(read_json(path), str(path))


def read_generation_config(model_dir: Path) -> dict:
    """generation_config.json (required by upstream too): the checkpoint's sampling defaults."""
    return read_json(Path(model_dir) / "generation_config.json")
