"""Config dicts in the published on-disk layout, for the random-weight checkpoints we write ourselves.

`real` sizes carry the published numbers (QWEN3_TTS_FACTS.md §3); `tiny` keeps every vocabulary,
token id, codebook count and rate, but shrinks the widths so a whole model runs on a CPU in seconds.
The predictor width differs from the talker width in `tiny` so `small_to_mtp_projection` is exercised.
"""
from __future__ import annotations

import copy

SIZES = ("tiny", "0.6b", "1.7b")
MODEL_TYPES = ("base", "custom_voice", "voice_design")

LANGUAGE_IDS = {
    "english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058, "french": 2061,
    "sichuan_dialect": 2062, "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071,
    "beijing_dialect": 2074,
}
SPEAKER_IDS = {
    "vivian": 3065, "serena": 3066, "uncle_fu": 3010, "dylan": 2878, "eric": 2875,
    "ryan": 3061, "aiden": 2861, "ono_anna": 2873, "sohee": 2864,
}
SPEAKER_DIALECT = {name: False for name in SPEAKER_IDS} | {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}

# Text special-token ids. Real sizes use the published ids; tiny uses a compact 1024-entry vocabulary.
REAL_TEXT_IDS = {"im_start": 151644, "im_end": 151645, "tts_pad": 151671, "tts_bos": 151672, "tts_eos": 151673}
TINY_SPECIAL_BASE = 960  # tiny: specials start here, mirroring 151643 in the real vocabulary
TINY_TEXT_IDS = {k: v - 151643 + TINY_SPECIAL_BASE for k, v in REAL_TEXT_IDS.items()}

_WIDTHS = {
    #         talker H, I, layers, heads, kv, head_dim | pred H, I, layers, heads, kv, head_dim | text H, text vocab
    "tiny": dict(th=32, ti=64, tl=2, tn=4, tk=2, td=8, ph=16, pi=32, pl=1, pn=2, pk=1, pd=8, xh=16, xv=1024),
    "0.6b": dict(th=1024, ti=3072, tl=28, tn=16, tk=8, td=128, ph=1024, pi=3072, pl=5, pn=16, pk=8, pd=128,
                 xh=2048, xv=151936),
    "1.7b": dict(th=2048, ti=6144, tl=28, tn=16, tk=8, td=128, ph=1024, pi=3072, pl=5, pn=16, pk=8, pd=128,
                 xh=2048, xv=151936),
}
_SIZE_TAG = {"tiny": "tiny", "0.6b": "0b6", "1.7b": "1b7"}


def main_config(size: str, model_type: str) -> dict:
    """The top-level config.json for a checkpoint of this size and type."""
    if size not in SIZES or model_type not in MODEL_TYPES:
        raise ValueError(f"size must be one of {SIZES} and model_type one of {MODEL_TYPES}")
    if size == "0.6b" and model_type == "voice_design":
        raise ValueError("there is no 0.6B VoiceDesign checkpoint; use size 1.7b (or tiny)")
    w = _WIDTHS[size]
    ids = TINY_TEXT_IDS if size == "tiny" else REAL_TEXT_IDS
    half = w["td"] // 2  # M-RoPE sections must sum to head_dim / 2
    section = [24, 20, 20] if w["td"] == 128 else [half - 2 * (half // 4), half // 4, half // 4]
    predictor = {
        "vocab_size": 2048, "hidden_size": w["ph"], "intermediate_size": w["pi"], "num_hidden_layers": w["pl"],
        "num_attention_heads": w["pn"], "num_key_value_heads": w["pk"], "head_dim": w["pd"],
        "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": None, "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": w["pl"], "layer_types": ["full_attention"] * w["pl"], "attention_dropout": 0.0,
        "num_code_groups": 16, "tie_word_embeddings": False, "initializer_range": 0.02, "use_cache": True,
    }
    talker = {
        "code_predictor_config": predictor,
        "vocab_size": 3072, "hidden_size": w["th"], "intermediate_size": w["ti"], "num_hidden_layers": w["tl"],
        "num_attention_heads": w["tn"], "num_key_value_heads": w["tk"], "head_dim": w["td"],
        "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": section, "rope_type": "default", "type": "default"},
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "attention_dropout": 0.0,
        "num_code_groups": 16, "text_hidden_size": w["xh"], "text_vocab_size": w["xv"],
        "position_id_per_seconds": 13, "initializer_range": 0.02, "use_cache": True,
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "codec_language_id": dict(LANGUAGE_IDS),
        "spk_id": dict(SPEAKER_IDS) if model_type == "custom_voice" else {},
        "spk_is_dialect": dict(SPEAKER_DIALECT) if model_type == "custom_voice" else {},
    }
    enc_dim = w["th"]  # the x-vector fills one talker position, so its width is the talker width
    speaker = {"mel_dim": 128, "enc_dim": enc_dim, "sample_rate": 24000}
    if size == "tiny":
        speaker.update(enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8, enc_res2net_scale=4,
                       enc_se_channels=8)
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": _SIZE_TAG[size],
        "tts_model_type": model_type,
        "im_start_token_id": ids["im_start"], "im_end_token_id": ids["im_end"],
        "tts_pad_token_id": ids["tts_pad"], "tts_bos_token_id": ids["tts_bos"], "tts_eos_token_id": ids["tts_eos"],
        "assistant_token_id": 77091,
        "speaker_encoder_config": speaker,
        "talker_config": talker,
        "transformers_version": "4.57.3",
    }


def generation_config() -> dict:
    """The published sampling defaults."""
    return {
        "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
        "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
        "max_new_tokens": 8192,
    }


_CODEC_REAL = {
    "encoder_config": {
        "audio_channels": 1, "num_filters": 64, "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3,
        "num_residual_layers": 1, "dilation_growth_rate": 2, "compress": 2, "upsampling_ratios": [8, 6, 5, 4],
        "use_causal_conv": True, "pad_mode": "constant", "trim_right_ratio": 1.0, "use_conv_shortcut": False,
        "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 64, "intermediate_size": 2048, "hidden_act": "gelu", "norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01, "rope_theta": 10000.0, "max_position_embeddings": 8000,
        "sliding_window": 250, "attention_bias": False, "attention_dropout": 0.0,
        "num_quantizers": 32, "num_semantic_quantizers": 1, "codebook_size": 2048, "codebook_dim": 256,
        "vector_quantization_hidden_dimension": 256, "upsample_groups": 512, "frame_rate": 12.5,
        "sampling_rate": 24000, "initializer_range": 0.02, "use_cache": False, "model_type": "mimi",
    },
    "decoder_config": {
        "attention_bias": False, "attention_dropout": 0.0, "latent_dim": 1024, "codebook_dim": 512,
        "codebook_size": 2048, "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512,
        "intermediate_size": 1024, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
        "head_dim": 64, "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16,
        "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000,
        "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512,
    },
}
_CODEC_TINY_OVERRIDES = {
    "encoder_config": {"num_filters": 4, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "num_quantizers": 16,
                       "codebook_dim": 16, "vector_quantization_hidden_dimension": 16, "upsample_groups": 32},
    "decoder_config": {"latent_dim": 32, "codebook_dim": 16, "decoder_dim": 64, "hidden_size": 32,
                       "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
                       "num_hidden_layers": 2, "vector_quantization_hidden_dimension": 16},
}


def codec_config(size: str) -> dict:
    """speech_tokenizer/config.json. Every published checkpoint ships the same codec."""
    cfg = copy.deepcopy(_CODEC_REAL)
    if size == "tiny":
        for part, over in _CODEC_TINY_OVERRIDES.items():
            cfg[part].update(over)
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
        **cfg,
        "transformers_version": "4.57.3",
    }
