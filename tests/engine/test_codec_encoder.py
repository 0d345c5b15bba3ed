"""MimiEncoder (engine/codec/encoder.py) against the official codec encoder path of qwen-tts 0.1.1.

The oracle is the official wrapper `Qwen3TTSTokenizer.encode` (EncodecFeatureExtractor at 24 kHz,
padding masks, frame trimming) over a tiny `Qwen3TTSTokenizerV2Model` with random weights. Codes must
be exactly equal.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.checkpoint.presets import codec_config
from engine.codec.encoder import MimiEncoder, MimiEncoderConfig
from engine.errors import CheckpointError, InvalidInputError

SR = 24000


@pytest.fixture(scope="module")
def oracle(qwen_tts):
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
    from transformers import EncodecFeatureExtractor

    return Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model, Qwen3TTSTokenizer, EncodecFeatureExtractor


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Weights and codebooks of a realistic spread (the HF init leaves the codebooks all zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if "layernorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.endswith("scale"):
                p.copy_(0.3 + 0.1 * noise)
            else:
                p.copy_(noise / p[0].numel() ** 0.5)
        for name, b in sorted(module.named_buffers()):
            if name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("cluster_usage"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def _wave(seconds: float | None = None, samples: int | None = None, seed: int = 0) -> np.ndarray:
    n = samples if samples is not None else int(round(seconds * SR))
    t = np.arange(n) / SR
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * 200 * t * (1 + 0.2 * t)) + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.fixture(scope="module")
def pair(oracle):
    cfg_cls, model_cls, tok_cls, fe_cls = oracle
    d = codec_config("tiny")
    official = model_cls(cfg_cls(**d)).eval()
    _randomize(official.encoder, seed=1234)
    tok = tok_cls()
    tok.model, tok.device = official, torch.device("cpu")
    # speech_tokenizer/preprocessor_config.json of the published checkpoints
    tok.feature_extractor = fe_cls(feature_size=1, sampling_rate=SR, padding_value=0.0)
    ours = MimiEncoder(d["encoder_config"], d["encoder_valid_num_quantizers"]).eval()
    sd = {k[len("encoder."):]: v for k, v in official.state_dict().items() if k.startswith("encoder.")}
    assert set(sd) == set(ours.state_dict())
    ours.load_state_dict(sd, strict=True)
    return official, tok, ours


def test_state_dict_keys_equal_official(pair):
    official, _, ours = pair
    theirs = {k[len("encoder."):]: tuple(v.shape) for k, v in official.state_dict().items() if k.startswith("encoder.")}
    assert theirs == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    # the wrapper drops Mimi's decoder half: no upsample / decoder_transformer / decoder keys remain
    assert not any(k.startswith(("upsample.", "decoder_transformer.", "decoder.")) for k in theirs)


def test_real_config_keys_and_shapes(oracle):
    """At the shipped size (32 quantizers, 8 layers) the key set and every shape match too."""
    cfg_cls, model_cls, _, _ = oracle
    d = codec_config("0.6b")
    with torch.device("meta"):
        official = model_cls(cfg_cls(**d))
        ours = MimiEncoder(d["encoder_config"], d["encoder_valid_num_quantizers"])
    theirs = {k[len("encoder."):]: tuple(v.shape) for k, v in official.state_dict().items() if k.startswith("encoder.")}
    assert theirs == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert len(ours.quantizer.acoustic_residual_vector_quantizer.layers) == 31


@pytest.mark.parametrize("seconds", [1.3, 2.0, 3.7])
def test_codes_equal_official(pair, seconds):
    _, tok, ours = pair
    wav = _wave(seconds, seed=int(seconds * 10))
    ref = tok.encode(wav, sr=SR).audio_codes[0]
    mine = ours.encode(torch.from_numpy(wav))
    assert mine.dtype == torch.long and mine.shape == (-(-len(wav) // 1920), 16)
    assert ref.shape == mine.shape
    assert torch.equal(ref, mine)
    assert mine.unique().numel() > 100  # the random codebooks really are exercised


@pytest.mark.parametrize("samples", [240, 1920, 1921, 3839, 3841])
def test_frame_count_edges(pair, samples):
    _, tok, ours = pair
    wav = _wave(samples=samples, seed=samples)
    ref = tok.encode(wav, sr=SR).audio_codes[0]
    mine = ours.encode(torch.from_numpy(wav))
    assert mine.shape[0] == ours.num_frames(samples) == -(-samples // 1920)
    assert torch.equal(ref, mine)


def test_long_input_has_no_sliding_window(pair):
    """12.5 s = 312 encoder steps at 25 Hz, past the config's sliding_window of 250: still exact."""
    _, tok, ours = pair
    wav = _wave(12.5, seed=7)
    assert torch.equal(tok.encode(wav, sr=SR).audio_codes[0], ours.encode(torch.from_numpy(wav)))


def test_batch_equals_official_batch(pair):
    _, tok, ours = pair
    wavs = [_wave(s, seed=i) for i, s in enumerate((1.3, 2.0, 3.7))]
    refs = tok.encode(wavs, sr=SR).audio_codes
    mine = ours.encode_batch([torch.from_numpy(w) for w in wavs])
    assert all(torch.equal(a, b) for a, b in zip(refs, mine))
    # equal-length rows of a [B, T] batch equal their single-item results
    stacked = torch.from_numpy(np.stack([wavs[0], _wave(1.3, seed=9)]))
    both = ours.encode(stacked)
    assert torch.equal(both[0], ours.encode(stacked[0])) and torch.equal(both[1], ours.encode(stacked[1]))


def test_bf16_codes_equal_official(pair):
    """In bf16 (how upstream runs the codec on a GPU) the codes still agree on the same CPU kernels.

    from_pretrained(dtype=bf16) keeps RoPE inv_freq in float32 and casts the codebooks; the module
    copies are set up the same way here.
    """
    official, tok, ours = pair
    import copy

    off16 = copy.deepcopy(official).to(torch.bfloat16)
    for m in off16.modules():
        if hasattr(m, "original_inv_freq"):
            m.inv_freq = m.original_inv_freq.float()
        if hasattr(m, "_embed"):
            m._embed = None
    tok16 = copy.copy(tok)
    tok16.model = off16
    ours16 = copy.deepcopy(ours).to(torch.bfloat16)
    wav = _wave(2.0, seed=3)
    assert torch.equal(tok16.encode(wav, sr=SR).audio_codes[0], ours16.encode(torch.from_numpy(wav)))


def test_input_errors(pair):
    _, _, ours = pair
    with pytest.raises(InvalidInputError):
        ours.encode(torch.zeros(0))
    with pytest.raises(InvalidInputError):
        ours.encode(torch.zeros(2, 3, 100))
    bad = torch.zeros(4000)
    bad[5] = float("nan")
    with pytest.raises(InvalidInputError):
        ours.encode(bad)


def test_config_errors():
    d = dict(codec_config("tiny")["encoder_config"])
    del d["num_filters"]
    with pytest.raises(CheckpointError, match="num_filters"):
        MimiEncoderConfig.from_dict(d)
    d = codec_config("tiny")["encoder_config"]
    with pytest.raises(CheckpointError):
        MimiEncoder(d, valid_num_quantizers=99)
