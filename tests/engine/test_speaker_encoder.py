"""Speaker encoder (ECAPA-TDNN) and its mel front end against qwen-tts 0.1.1 (fp32, CPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.checkpoint.presets import main_config
from engine.config import ModelConfig, SpeakerEncoderConfig
from engine.errors import InvalidInputError
from engine.model.mel import SPEAKER_MEL, log_mel_spectrogram, slaney_mel_filterbank
from engine.model.speaker_encoder import SpeakerEncoder

SR = 24000
TOL = 1e-5


def _randomize(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            p.copy_(0.1 * noise if name.endswith("bias") else noise / p[0].numel() ** 0.5)


@pytest.fixture(scope="module")
def pair(talker_oracle):
    m, config_cls = talker_oracle
    d = main_config("tiny", "base")
    official = m.Qwen3TTSForConditionalGeneration(config_cls(**d)).eval()
    _randomize(official.speaker_encoder, seed=99)
    ours = SpeakerEncoder(ModelConfig.from_dict(d).speaker_encoder).eval()
    sd = {k[len("speaker_encoder."):]: v for k, v in official.state_dict().items() if k.startswith("speaker_encoder.")}
    assert set(sd) == set(ours.state_dict())
    ours.load_state_dict(sd, strict=True)
    return m, official, ours


def _sine_noise(seconds: float, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    rng = np.random.default_rng(seed)
    return (0.4 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def _random(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(0.3 * rng.standard_normal(int(seconds * SR)), -1, 1).astype(np.float32)


def test_state_dict_keys_and_shapes(pair):
    _, official, ours = pair
    theirs = {k[len("speaker_encoder."):]: tuple(v.shape) for k, v in official.state_dict().items()
              if k.startswith("speaker_encoder.")}
    assert theirs == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert {k.split(".")[0] for k in theirs} == {"blocks", "mfa", "asp", "fc"}


def test_filterbank_matches_librosa():
    librosa = pytest.importorskip("librosa")
    ref = librosa.filters.mel(sr=SR, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    ours = slaney_mel_filterbank(SR, 1024, 128, 0.0, 12000.0)
    assert ours.dtype == np.float32 and ours.shape == (128, 513)
    assert np.abs(ours - ref).max() <= 1e-7


@pytest.mark.parametrize("make,seconds", [(_sine_noise, 2.5), (_random, 3.0), (_sine_noise, 1.0)])
def test_mel_matches_official(pair, make, seconds):
    m, _, _ = pair
    wav = torch.from_numpy(make(seconds, seed=int(seconds * 7)))[None]
    ref = m.mel_spectrogram(wav, n_fft=1024, num_mels=128, sampling_rate=SR, hop_size=256, win_size=1024,
                            fmin=0, fmax=12000)
    ours = log_mel_spectrogram(wav, **SPEAKER_MEL)
    assert ours.shape == ref.shape == (1, 128, (wav.shape[-1] + 768 - 1024) // 256 + 1)
    diff = (ours - ref).abs().max().item()
    print(f"mel max|diff| ({seconds} s): {diff:.3g}")
    assert diff <= TOL


@pytest.mark.parametrize("make,seconds", [(_sine_noise, 2.5), (_random, 3.0), (_sine_noise, 2.0)])
def test_embedding_matches_official(pair, make, seconds):
    _, official, ours = pair
    wav = make(seconds, seed=int(seconds * 11))
    ref = official.extract_speaker_embedding(wav, SR)
    emb = ours.embed(torch.from_numpy(wav))
    assert emb.shape == ref.shape == (ours.embedding_dim,)
    diff = (emb - ref).abs().max().item()
    print(f"embedding max|diff| ({seconds} s): {diff:.3g} (|ref| max {ref.abs().max().item():.3g})")
    assert diff <= TOL
    assert ref.abs().max().item() > 0.1  # the random network produces a non-trivial embedding


def test_forward_batch_equals_rows(pair):
    _, _, ours = pair
    mel = log_mel_spectrogram(torch.from_numpy(np.stack([_random(2.0, 1), _sine_noise(2.0, 2)])), **SPEAKER_MEL)
    both = ours(mel.transpose(1, 2))
    rows = torch.cat([ours(mel[i:i + 1].transpose(1, 2)) for i in range(2)])
    assert both.shape == (2, ours.embedding_dim)
    assert (both - rows).abs().max().item() <= 1e-5


def test_embed_in_bf16_close_to_fp32(pair):
    import copy

    _, _, ours = pair
    wav = torch.from_numpy(_sine_noise(2.0, 5))
    ref = ours.embed(wav)
    low = copy.deepcopy(ours).to(torch.bfloat16).embed(wav)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max().item() <= 0.05 * ref.abs().max().item()


def test_real_size_parameter_count(talker_oracle):
    """0.6B: enc_dim 1024 with the code's default channels -> about 8.85 M parameters (FACTS §11)."""
    m, _ = talker_oracle
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig

    counts = {}
    for enc_dim in (1024, 2048):
        with torch.device("meta"):
            ours = SpeakerEncoder(SpeakerEncoderConfig.from_dict({"enc_dim": enc_dim, "sample_rate": SR}))
            theirs = m.Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(enc_dim=enc_dim))
        counts[enc_dim] = sum(p.numel() for p in ours.parameters())
        assert counts[enc_dim] == sum(p.numel() for p in theirs.parameters())
        assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    print(f"ECAPA parameters: {counts}")
    assert abs(counts[1024] - 8.85e6) < 0.01e6
    assert abs(counts[2048] - 12.0e6) < 0.05e6


def test_too_short_for_mel():
    with pytest.raises(InvalidInputError):
        log_mel_spectrogram(torch.zeros(1, 200))
