"""Build our modules for a checkpoint directory and load its weights into them.

Modules are created on the meta device (no random init, no memory), materialised empty on the target
device and then filled from the safetensors files, so loading costs about one read of the weights.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig, read_generation_config
from ..errors import CheckpointError
from .codec_source import resolve_codec
from .finite import check_finite
from .reader import check_layout, load_state_dict_into


def materialize(build, device: torch.device, dtype: torch.dtype, weights: Path, prefix: str):
    """Construct a module on the meta device, then fill it from the `prefix`-keyed tensors of `weights`."""
    with torch.device("meta"):
        module = build()
    load_state_dict_into(module, weights, prefix, dtype, device)
    check_finite(module, weights, prefix)  # loaded weights only: the rebuilt buffers below are ours
    for sub in module.modules():  # non-persistent buffers (RoPE tables...) are rebuilt, not loaded
        reset = getattr(sub, "reset_buffers", None)
        if callable(reset):
            reset(device)
    left = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.is_meta]
    if left:  # load_state_dict_into reports missing tensors; this guards what it cannot see
        raise CheckpointError(f"{weights} left tensors unloaded ({', '.join(left[:5])}); the checkpoint is incomplete "
                              "or of another layout: re-download it.")
    return module.eval().requires_grad_(False)


def load_components(model_dir: Path, device: torch.device, dtype: torch.dtype, codec_dir: Path | None = None,
                    codec_loaded=None) -> dict:
    """The checkpoint's modules with their weights. The codec decoder is read first and handed to
    `codec_loaded(decoder)` at once, so its set-up can run while the talker's weights are read."""
    from ..codec.config import CodecConfig
    from ..codec.decoder import CodecDecoder
    from ..codec.model import SpeechTokenizer
    from ..model.talker import Talker
    from ..text_tokenizer import TextTokenizer

    model_dir = Path(model_dir)
    check_layout(model_dir, own_codec=codec_dir is None)
    cfg = ModelConfig.from_dir(model_dir)
    source = resolve_codec(model_dir, codec_dir, cfg.tts_model_size, cfg.talker.num_code_groups,
                           cfg.talker.predictor.vocab_size)
    defaults = read_generation_config(model_dir)
    tokenizer = TextTokenizer.from_dir(model_dir)
    codec_cfg = CodecConfig.from_file(source.path / "config.json")
    codec_weights = source.path / "model.safetensors"
    decoder = materialize(lambda: CodecDecoder(codec_cfg.decoder), device, dtype, codec_weights, "decoder.")
    if codec_loaded is not None:
        codec_loaded(decoder)
    weights = model_dir / "model.safetensors"
    talker = materialize(lambda: Talker(cfg.talker), device, dtype, weights, "talker.")

    speaker_encoder = None
    if cfg.speaker_encoder is not None:
        from ..model.speaker_encoder import SpeakerEncoder

        speaker_encoder = materialize(lambda: SpeakerEncoder(cfg.speaker_encoder), device, dtype, weights,
                                      "speaker_encoder.")

    codec = SpeechTokenizer(codec_cfg, decoder=decoder)
    if cfg.tts_model_type == "base":  # reference codes are only needed for ICL cloning
        from ..codec.encoder import MimiEncoder

        codec.encoder = materialize(lambda: MimiEncoder(codec_cfg.encoder, codec_cfg.encoder_valid_num_quantizers),
                                    device, dtype, codec_weights, "encoder.")
    return {"config": cfg, "defaults": defaults, "tokenizer": tokenizer, "talker": talker,
            "speaker_encoder": speaker_encoder, "codec": codec, "codec_source": source}
