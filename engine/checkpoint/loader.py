"""Build our modules for a checkpoint directory and load its weights into them.

Modules are created on the meta device (no random init, no memory), materialised empty on the target
device and then filled from the safetensors files, so loading costs about one read of the weights.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig, read_generation_config
from ..config_fields import FIX
from ..errors import CheckpointError, InvalidInputError
from ..sampling import SamplingParams
from .codec_source import resolve_codec
from .finite import check_finite
from .reader import check_layout, load_state_dict_into

# What a module's constructor raises when a config value passed its field checks but the combination cannot be
# built (a width that no layer can take): still the config's fault, so still a CheckpointError.
_BUILD_ERRORS = (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, RuntimeError)


def from_config(build, config: Path):
    """`build` made to report a module its config cannot describe as a CheckpointError naming `config`."""
    def checked():
        try:
            return build()
        except CheckpointError:
            raise
        except _BUILD_ERRORS as exc:
            raise CheckpointError(f"{config} describes a model that cannot be built ({type(exc).__name__}: "
                                  f"{exc}). {FIX}") from exc
    return checked


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


def read_configs(model_dir: Path, codec_dir: Path | None = None) -> dict:
    """Every config a load reads, parsed and checked before any weights are touched: the layout, config.json,
    generation_config.json, the codec's config (and that it fits the talker). A wrong field ends here in a
    CheckpointError naming the file and the field."""
    from ..codec.config import CodecConfig

    model_dir = Path(model_dir)
    check_layout(model_dir, own_codec=codec_dir is None)
    cfg = ModelConfig.from_dir(model_dir)
    source = resolve_codec(model_dir, codec_dir, cfg.tts_model_size, cfg.talker.num_code_groups,
                           cfg.talker.predictor.vocab_size)
    defaults = read_generation_config(model_dir)
    sampling = check_generation_config(defaults, model_dir / "generation_config.json")
    codec_json = source.path / "config.json"
    codec_cfg = CodecConfig.from_file(codec_json)
    check_codec_fits(cfg, codec_cfg, codec_json)
    encoder_cfg = None
    if cfg.tts_model_type == "base":  # only Base encodes reference audio; its encoder is built last
        from ..codec.encoder_config import MimiEncoderConfig

        encoder_cfg = MimiEncoderConfig.from_dict(codec_cfg.encoder)
    return {"config": cfg, "defaults": defaults, "sampling": sampling, "codec_source": source,
            "codec_config": codec_cfg, "encoder_config": encoder_cfg}


def load_components(model_dir: Path, device: torch.device, dtype: torch.dtype, codec_dir: Path | None = None,
                    codec_loaded=None) -> dict:
    """The checkpoint's modules with their weights. The codec decoder is read first and handed to
    `codec_loaded(decoder)` at once, so its set-up can run while the talker's weights are read."""
    from ..codec.decoder import CodecDecoder
    from ..codec.model import SpeechTokenizer
    from ..model.talker import Talker
    from ..text_tokenizer import TextTokenizer

    model_dir = Path(model_dir)
    configs = read_configs(model_dir, codec_dir)
    cfg, codec_cfg, source = configs["config"], configs["codec_config"], configs["codec_source"]
    main_json, codec_json = model_dir / "config.json", source.path / "config.json"
    tokenizer = TextTokenizer.from_dir(model_dir)
    codec_weights = source.path / "model.safetensors"
    decoder = materialize(from_config(lambda: CodecDecoder(codec_cfg.decoder), codec_json), device, dtype,
                          codec_weights, "decoder.")
    if codec_loaded is not None:
        codec_loaded(decoder)
    weights = model_dir / "model.safetensors"
    talker = materialize(from_config(lambda: Talker(cfg.talker), main_json), device, dtype, weights, "talker.")

    speaker_encoder = None
    if cfg.speaker_encoder is not None:
        from ..model.speaker_encoder import SpeakerEncoder

        speaker_encoder = materialize(from_config(lambda: SpeakerEncoder(cfg.speaker_encoder), main_json), device,
                                      dtype, weights, "speaker_encoder.")

    codec = SpeechTokenizer(codec_cfg, decoder=decoder)
    if cfg.tts_model_type == "base":  # reference codes are only needed for ICL cloning
        from ..codec.encoder import MimiEncoder

        encoder = from_config(lambda: MimiEncoder(codec_cfg.encoder, codec_cfg.encoder_valid_num_quantizers), codec_json)
        codec.encoder = materialize(encoder, device, dtype, codec_weights, "encoder.")
    return {"config": cfg, "defaults": configs["defaults"], "tokenizer": tokenizer, "talker": talker,
            "speaker_encoder": speaker_encoder, "codec": codec, "codec_source": source}


def check_generation_config(defaults: dict, path: Path) -> SamplingParams:
    """The checkpoint's sampling defaults, checked by the rules every call's settings obey: a wrong value is
    refused at load, naming the file and the field, not at every generate."""
    try:
        return SamplingParams.from_generation_config(defaults).validate(label=lambda name: f"field '{name}'")
    except InvalidInputError as exc:
        raise CheckpointError(f"{path}: {exc} {FIX}") from exc


def check_codec_fits(cfg: ModelConfig, codec_cfg, path: Path) -> None:
    """The codec decodes exactly the talker's codes: as many codebooks, as many entries each (a code past the
    codebook would index outside its embedding)."""
    dec, talker = codec_cfg.decoder, cfg.talker
    if (dec.num_quantizers, dec.codebook_size) != (talker.num_code_groups, talker.predictor.vocab_size):
        raise CheckpointError(
            f"{path}: fields 'decoder_config.num_quantizers' and 'decoder_config.codebook_size' say the codec's codes "
            f"are {dec.num_quantizers} codebooks x {dec.codebook_size} entries, but the model's config.json says "
            f"{talker.num_code_groups} x {talker.predictor.vocab_size} ('talker_config.num_code_groups', "
            f"'code_predictor_config.vocab_size'). {FIX}")
