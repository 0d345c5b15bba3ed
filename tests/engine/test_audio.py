"""engine/audio.py: WAV I/O, mono mixdown, resampling (equal to upstream's librosa call), reference validation."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from engine.audio import load_wav, prepare_reference, resample, save_wav, to_mono, validate_reference
from engine.errors import InvalidInputError, ReferenceAudioError


def _write_raw_wav(path, payload: bytes, channels: int, sr: int, bits: int, tag: int, extensible: bool = False):
    """A minimal RIFF/WAVE writer, independent of the code under test."""
    block = channels * bits // 8
    if extensible:
        guid_tail = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt = struct.pack("<HHIIHHHHI", 0xFFFE, channels, sr, sr * block, block, bits, 22, bits, 0)
        fmt += struct.pack("<H", tag) + guid_tail
    else:
        fmt = struct.pack("<HHIIHH", tag, channels, sr, sr * block, block, bits)
    extra = b"LIST" + struct.pack("<I", 5) + b"abcde" + b"\x00"  # odd-sized chunk before data (padding byte)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", len(payload)) + payload
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def _ints(bits: int, channels: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    hi = 1 << (bits - 1)
    x = rng.integers(-hi, hi, size=(n, channels), dtype=np.int64)
    x[0, 0], x[1, 0] = -hi, hi - 1  # the extremes
    return x


@pytest.mark.parametrize("bits", [8, 16, 24, 32])
@pytest.mark.parametrize("channels", [1, 2])
def test_load_pcm_widths(tmp_path, bits, channels):
    n, sr = 1001, 22050
    ints = _ints(bits, channels, n, seed=bits + channels)
    if bits == 8:
        payload = (ints + 128).astype(np.uint8).tobytes()
    elif bits == 24:
        u = (ints & 0xFFFFFF).astype(np.uint32)
        payload = np.stack([u & 0xFF, (u >> 8) & 0xFF, (u >> 16) & 0xFF], axis=-1).astype(np.uint8).tobytes()
    else:
        payload = ints.astype(f"<i{bits // 8}").tobytes()
    path = tmp_path / f"pcm{bits}_{channels}.wav"
    _write_raw_wav(path, payload, channels, sr, bits, tag=1, extensible=(bits == 24))
    x, got_sr = load_wav(path)
    assert got_sr == sr and x.dtype == np.float32 and x.shape == (channels, n)
    expect = (ints.T / float(1 << (bits - 1))).astype(np.float32)
    assert np.array_equal(x, expect)
    assert x.min() == -1.0 and x.max() <= 1.0  # (2^31 - 1) / 2^31 rounds to 1.0 in float32
    sf = pytest.importorskip("soundfile")
    if bits > 8:  # soundfile's float scaling is the one upstream sees
        ref, _ = sf.read(str(path), dtype="float32", always_2d=True)
        assert np.array_equal(x, ref.T)


@pytest.mark.parametrize("bits", [32, 64])
def test_load_float(tmp_path, bits):
    rng = np.random.default_rng(bits)
    data = (rng.standard_normal((777, 2)) * 0.4).astype(f"<f{bits // 8}")
    path = tmp_path / f"f{bits}.wav"
    _write_raw_wav(path, data.tobytes(), 2, 48000, bits, tag=3)
    x, sr = load_wav(path)
    assert sr == 48000 and np.array_equal(x, data.T.astype(np.float32))


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    grid = rng.integers(-32768, 32768, size=(2, 5000)).astype(np.float32) / 32768.0
    save_wav(tmp_path / "a.wav", grid, 24000)
    x, sr = load_wav(tmp_path / "a.wav")
    assert sr == 24000 and np.array_equal(x, grid)  # 16-bit values survive exactly
    # mono torch input, out-of-range values clip, 1-D comes back as one channel
    wav = torch.tensor([0.0, 0.5, -0.5, 1.5, -1.5, 1 / 3])
    save_wav(tmp_path / "b.wav", wav, 16000)
    y, sr = load_wav(tmp_path / "b.wav")
    assert sr == 16000 and y.shape == (1, 6)
    assert np.allclose(y[0], [0.0, 0.5, -0.5, 32767 / 32768, -1.0, round(32768 / 3) / 32768], atol=0)
    with pytest.raises(InvalidInputError):
        save_wav(tmp_path / "c.wav", np.array([0.0, np.nan]), 24000)


def test_load_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_wav(tmp_path / "missing.wav")
    (tmp_path / "x.mp3").write_bytes(b"ID3\x03" + b"\x00" * 64)
    with pytest.raises(InvalidInputError, match="not a WAV"):
        load_wav(tmp_path / "x.mp3")
    _write_raw_wav(tmp_path / "alaw.wav", b"\x00" * 100, 1, 8000, 8, tag=6)
    with pytest.raises(InvalidInputError, match="unsupported"):
        load_wav(tmp_path / "alaw.wav")


def test_to_mono():
    x = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -0.5]], dtype=np.float32)
    assert np.array_equal(to_mono(x), [0.5, 0.5, 0.0]) and to_mono(x).dtype == np.float32
    t = torch.from_numpy(x)
    assert torch.equal(to_mono(t), torch.tensor([0.5, 0.5, 0.0]))
    assert to_mono(t[0]) is t[0] or torch.equal(to_mono(t[0]), t[0])
    b = torch.stack([t, 2 * t])  # ComfyUI [B, C, T]
    assert to_mono(b).shape == (2, 3)


def _sine(freq: float, sr: int, seconds: float = 2.0, amp: float = 0.5) -> np.ndarray:
    return amp * np.sin(2 * np.pi * freq * np.arange(int(seconds * sr)) / sr)


@pytest.mark.parametrize("sr_in", [8000, 16000, 22050, 32000, 44100, 48000, 11025, 96000])
def test_resample_equals_librosa_default(sr_in):
    """librosa.resample's default (upstream's call) sample for sample, including its output length
    ceil(T * 24000 / sr): soxr alone is one sample short at 32 kHz."""
    librosa = pytest.importorskip("librosa")
    x = (np.random.default_rng(sr_in).standard_normal(sr_in + 123) * 0.1).astype(np.float32)
    ours = resample(torch.from_numpy(x), sr_in, 24000)
    ref = librosa.resample(x, orig_sr=sr_in, target_sr=24000)
    assert ours.dtype == torch.float32 and ours.shape[-1] == math.ceil(x.shape[-1] * (24000 / sr_in))
    assert np.array_equal(ours.numpy(), ref)


def test_resample_length_rule_and_identity():
    y = np.zeros(88200, np.float32)  # the float ratio adds a sample: 44100 -> 24000 gives 48001
    assert resample(y, 44100, 24000).shape[-1] == 48001
    x = torch.randn(1000)
    assert torch.equal(resample(x, 24000, 24000), x)
    with pytest.raises(ReferenceAudioError, match="cannot resample"):
        resample(x, 0, 24000)
    with pytest.raises(ReferenceAudioError, match="mono"):
        resample(torch.randn(2, 1000), 48000, 24000)


def test_validate_reference():
    sr = 24000
    good = 0.1 * np.sin(np.arange(sr * 2) / 10.0)
    validate_reference(good, sr)
    validate_reference(torch.from_numpy(np.stack([good, good])), sr)  # [C, T]
    with pytest.raises(ReferenceAudioError, match="shorter than 1 s; use at least 1 s"):
        validate_reference(good[: sr // 2], sr)
    with pytest.raises(ReferenceAudioError, match="silent"):
        validate_reference(np.zeros(sr * 2), sr)
    with pytest.raises(ReferenceAudioError, match="silent"):
        validate_reference(np.full(sr * 2, 1e-6), sr)
    bad = good.copy()
    bad[100] = np.nan
    with pytest.raises(ReferenceAudioError, match="NaN or Inf"):
        validate_reference(bad, sr)
    bad[100] = np.inf
    with pytest.raises(ReferenceAudioError, match="NaN or Inf"):
        validate_reference(torch.from_numpy(bad), sr)
    for rate in (0, -24000, 1, 3999, 768001, 10**12, 22050.5, float("nan"), float("inf"), None, "fast"):
        with pytest.raises(ReferenceAudioError, match="invalid sample rate"):
            validate_reference(good, rate)
    assert validate_reference(good, 24000.0) == 24000 and validate_reference(good, np.int64(8000)) == 8000
    with pytest.raises(ReferenceAudioError, match="empty"):
        validate_reference(np.zeros((2, 0), np.float32), sr)
    with pytest.raises(ReferenceAudioError):
        validate_reference(np.zeros((1, 1, 10)), sr)


def test_prepare_reference():
    x = np.stack([_sine(300, 48000), _sine(300, 48000)]).astype(np.float32)
    y = prepare_reference(x, 48000)
    assert y.shape == (48000,) and y.dtype == torch.float32
    assert abs(y.abs().max().item() - 0.5) < 1e-3  # no normalisation


def test_pcm16_of_float32_rounds_as_in_float64():
    """The engine's float32 audio goes to 16 bits without a float64 copy: scaling by 32768 is exact in float32, so
    every sample rounds and clips as the float64 formula does (half-way cases, tiny and huge values, both ends)."""
    from engine.audio import pcm16

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50_000, generator=gen) * scale for scale in (1e-4, 0.3, 1.0, 3.0)])
    steps = torch.arange(-40, 40, dtype=torch.float32) / 2 / 32768  # every half step near zero
    edges = torch.tensor([32767.5 / 32768, -32768.5 / 32768, 1.0, -1.0, 1e-42, -1e-42, 3e38, -3e38])
    x = torch.cat([x, steps, edges]).float()
    reference = np.clip(np.rint(x.double().numpy() * 32768.0), -32768, 32767).astype("<i2")[None]
    for samples in (x, x.numpy()):
        got = pcm16(samples)
        assert got.dtype == np.dtype("<i2") and got.shape == (1, x.numel()) and np.array_equal(got, reference)
    half = x.bfloat16()  # other float dtypes still go through float64
    assert np.array_equal(pcm16(half), np.clip(np.rint(half.double().numpy() * 32768.0), -32768, 32767)
                          .astype("<i2")[None])
    assert np.array_equal(pcm16(x.double()), reference)
    with pytest.raises(InvalidInputError, match="NaN"):
        pcm16(torch.tensor([0.0, float("nan")]))
