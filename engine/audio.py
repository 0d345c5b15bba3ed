"""Audio utilities with no audio library: WAV read/write (stdlib), mono mixdown, resampling (torch).

Layout convention: multichannel audio is [C, T] (channels first), as in ComfyUI's AUDIO waveform. Upstream
reads files as [T, C] and averages the last axis; `to_mono` does the same average on our layout.

Reference preparation as upstream does it (qwen-tts 0.1.1): mono average, then resample to 24 kHz
(librosa's default soxr "hq"). No loudness normalisation, no silence trimming, no clipping. Our
`resample` is a Kaiser-windowed sinc; its deviation from soxr is measured in tests/test_audio.py.
"""
from __future__ import annotations

import math
import struct
import wave
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .errors import InvalidInputError

# WAVE format tags (RIFF "fmt " chunk).
_FMT_PCM = 0x0001
_FMT_FLOAT = 0x0003
_FMT_EXTENSIBLE = 0xFFFE

MIN_REFERENCE_SECONDS = 1.0
SILENCE_PEAK = 1e-4


# ----------------------------------------------------------------------------------------------------------
# WAV files
# ----------------------------------------------------------------------------------------------------------

def _read_chunks(data: bytes, path: str) -> tuple[bytes, bytes]:
    """Return the payloads of the 'fmt ' and 'data' chunks of a RIFF/WAVE byte string."""
    if len(data) < 12 or data[0:4] not in (b"RIFF", b"RF64") or data[8:12] != b"WAVE":
        raise InvalidInputError(f"{path} is not a WAV file (no RIFF/WAVE header); convert it to WAV first.")
    fmt = body = None
    pos = 12
    while pos + 8 <= len(data):
        cid = data[pos:pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        start = pos + 8
        if cid == b"data" and (size == 0xFFFFFFFF or start + size > len(data)):
            size = len(data) - start  # streamed/RF64 writers leave the size open; take the rest
        payload = data[start:start + size]
        if cid == b"fmt ":
            fmt = payload
        elif cid == b"data":
            body = payload
            if fmt is not None:
                break
        pos = start + size + (size & 1)  # chunks are word aligned
    if fmt is None or body is None:
        raise InvalidInputError(f"{path} is a damaged WAV file (missing the 'fmt ' or 'data' chunk).")
    return fmt, body


def load_wav(path) -> tuple[np.ndarray, int]:
    """Read a WAV file as float32 samples [C, T] in [-1, 1] and its sample rate.

    Supports PCM 8/16/24/32-bit integer and 32/64-bit IEEE float, plain or WAVE_FORMAT_EXTENSIBLE.
    Integers are scaled by 1/2^(bits-1), the same scaling soundfile/librosa use, so the samples equal
    what the upstream loader would see.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"audio file {path} does not exist.")
    fmt, body = _read_chunks(path.read_bytes(), str(path))
    if len(fmt) < 16:
        raise InvalidInputError(f"{path} has a truncated 'fmt ' chunk; re-export the file.")
    tag, channels, sr, _, block_align, bits = struct.unpack_from("<HHIIHH", fmt, 0)
    if tag == _FMT_EXTENSIBLE and len(fmt) >= 26:
        (tag,) = struct.unpack_from("<H", fmt, 24)  # first two bytes of the sub-format GUID
    if channels < 1 or sr < 1:
        raise InvalidInputError(f"{path} declares {channels} channels at {sr} Hz; the file is damaged.")
    width = block_align // channels if block_align else (bits + 7) // 8
    n = len(body) // (width * channels)
    raw = body[: n * width * channels]
    if tag == _FMT_PCM and width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == _FMT_PCM and width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif tag == _FMT_PCM and width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.astype(np.float32) / float(1 << 23)
    elif tag == _FMT_PCM and width == 4:
        x = (np.frombuffer(raw, "<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    elif tag == _FMT_FLOAT and width == 4:
        x = np.frombuffer(raw, "<f4").astype(np.float32)
    elif tag == _FMT_FLOAT and width == 8:
        x = np.frombuffer(raw, "<f8").astype(np.float32)
    else:
        kind = {_FMT_PCM: "integer PCM", _FMT_FLOAT: "float"}.get(tag, f"format tag {tag:#06x}")
        raise InvalidInputError(
            f"{path}: unsupported WAV encoding ({kind}, {8 * width}-bit). Supported: 8/16/24/32-bit integer PCM "
            "and 32/64-bit float; convert the file (e.g. to 16-bit PCM WAV)."
        )
    return np.ascontiguousarray(x.reshape(n, channels).T), int(sr)


def save_wav(path, samples, sr: int) -> None:
    """Write samples [T] or [C, T] (float, nominally in [-1, 1]; numpy or torch) as 16-bit PCM WAV.

    Values are scaled by 32768, rounded and clipped to the int16 range, so a 16-bit file read with
    `load_wav` and written again is bit-identical.
    """
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().to("cpu", torch.float64).numpy()
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise InvalidInputError(f"save_wav expects samples shaped [T] or [C, T], got shape {tuple(x.shape)}.")
    if not np.isfinite(x).all():
        raise InvalidInputError("save_wav: the audio contains NaN or Inf values; nothing was written.")
    pcm = np.clip(np.rint(x * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(x.shape[0])
        w.setsampwidth(2)
        w.setframerate(int(sr))
        w.writeframes(np.ascontiguousarray(pcm.T).tobytes())


# ----------------------------------------------------------------------------------------------------------
# Channels
# ----------------------------------------------------------------------------------------------------------

def to_mono(x):
    """Average the channels: [T] is returned as is, [C, T] -> [T], [B, C, T] -> [B, T] (torch or numpy)."""
    if x.ndim <= 1:
        return x
    if isinstance(x, torch.Tensor):
        return x.mean(dim=-2)
    x = np.asarray(x)
    return x.mean(axis=-2, dtype=x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32)


# ----------------------------------------------------------------------------------------------------------
# Resampling
# ----------------------------------------------------------------------------------------------------------
# Band-limited interpolation with a Kaiser-windowed sinc, run as one strided conv1d over all output phases.
# With up = sr_out/g and down = sr_in/g, output n sits at input time n*down/up. Writing n = p + up*q, its
# taps start at q*down + floor(p*down/up), so each phase p is a conv with stride `down` and its own kernel.

_ZERO_CROSSINGS = 64  # sinc half-width in zero crossings of the (lower-rate) cutoff
_ROLLOFF = 0.945  # cutoff as a fraction of the lower Nyquist frequency
_KAISER_BETA = 12.0  # about 115-120 dB stopband


@lru_cache(maxsize=16)
def _polyphase_kernels(up: int, down: int) -> tuple[np.ndarray, int]:
    """Kernels [up, 1, K] (float64) and the left padding for a rational resampler up/down."""
    cutoff = min(1.0, up / down) * _ROLLOFF  # in cycles per input sample x2 (1.0 = input Nyquist)
    half_width = _ZERO_CROSSINGS / cutoff  # input samples
    reach = int(math.ceil(half_width)) + 1
    m = np.arange(-reach, down + reach, dtype=np.float64)  # tap offsets relative to q*down
    kernels = np.zeros((up, 1, m.size), dtype=np.float64)
    for p in range(up):
        t = p * down / up  # fractional output time relative to q*down
        tau = t - m
        window = np.zeros_like(tau)
        inside = np.abs(tau) < half_width
        window[inside] = np.i0(_KAISER_BETA * np.sqrt(1.0 - (tau[inside] / half_width) ** 2)) / np.i0(_KAISER_BETA)
        kernels[p, 0] = cutoff * np.sinc(cutoff * tau) * window
    return kernels, reach


def resample(x, sr_in: int, sr_out: int) -> torch.Tensor:
    """Resample along the last axis from sr_in to sr_out (Hz). x: Tensor [..., T] (numpy is converted).

    Output length is ceil(T * (sr_out / sr_in)) evaluated in float64, exactly as librosa.resample computes
    it (upstream's resampler): the float ratio can add one sample (44100 -> 24000 turns 88200 samples into
    48001), and the codec's frame count ceil(len / 1920) depends on it. Samples beyond the ends count as
    zeros. Float64 input is processed in float64, anything else in float32.
    """
    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.ascontiguousarray(x))
    sr_in, sr_out = int(sr_in), int(sr_out)
    if sr_in <= 0 or sr_out <= 0:
        raise InvalidInputError(f"sample rates must be positive (got {sr_in} -> {sr_out}).")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.to(dtype)
    if sr_in == sr_out:
        return x
    g = math.gcd(sr_in, sr_out)
    up, down = sr_out // g, sr_in // g
    if up > 4096:
        raise InvalidInputError(
            f"cannot resample {sr_in} Hz -> {sr_out} Hz: the rates share no convenient ratio; "
            "resample the file to a standard rate (e.g. 24000, 44100 or 48000 Hz) first."
        )
    kernels, reach = _polyphase_kernels(up, down)
    weight = torch.from_numpy(kernels).to(device=x.device, dtype=dtype)
    lead, length = x.shape[:-1], x.shape[-1]
    n_out = int(math.ceil(length * (sr_out / sr_in)))
    n_q = -(-n_out // up)
    k = weight.shape[-1]
    need = (n_q - 1) * down + k
    flat = x.reshape(-1, 1, length)
    flat = torch.nn.functional.pad(flat, (reach, max(0, need - length - reach)))
    y = torch.nn.functional.conv1d(flat, weight, stride=down)  # [N, up, n_q]
    y = y.transpose(1, 2).reshape(flat.shape[0], -1)[:, :n_out]
    return y.reshape(*lead, n_out)


# ----------------------------------------------------------------------------------------------------------
# Reference audio
# ----------------------------------------------------------------------------------------------------------

def validate_reference(x, sr: int) -> None:
    """Raise InvalidInputError unless x (mono [T] or [C, T], torch or numpy) is usable reference audio."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    x = np.asarray(x, dtype=np.float32)
    if x.ndim not in (1, 2) or x.size == 0:
        raise InvalidInputError(
            f"reference audio must be a waveform shaped [T] or [channels, T]; got shape {tuple(x.shape)}."
        )
    if not sr or sr <= 0:
        raise InvalidInputError(f"reference audio has an invalid sample rate ({sr}); pass the file's real rate.")
    if not np.isfinite(x).all():
        raise InvalidInputError(
            "reference audio contains NaN or Inf samples; re-export it or check the node that produced it."
        )
    seconds = x.shape[-1] / float(sr)
    if seconds < MIN_REFERENCE_SECONDS:
        raise InvalidInputError(
            f"reference audio is {seconds:.2f} s long, shorter than {MIN_REFERENCE_SECONDS:g} s; use at least "
            f"{MIN_REFERENCE_SECONDS:g} s (3-10 s of clean speech from one speaker works best)."
        )
    peak = float(np.abs(x).max())
    if peak < SILENCE_PEAK:
        raise InvalidInputError(
            f"reference audio is silent (peak {peak:.1e}); check the file, the input channel, or the volume."
        )


def prepare_reference(x, sr: int, target_sr: int = 24000) -> torch.Tensor:
    """Mix to mono, validate and resample to target_sr: the preparation upstream applies (no normalising).
    Validating the mono mix also rejects stereo whose channels cancel out."""
    x = to_mono(x)
    validate_reference(x, sr)
    return resample(torch.as_tensor(x, dtype=torch.float32), int(sr), target_sr).contiguous()
