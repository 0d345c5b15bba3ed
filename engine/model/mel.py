"""Log-mel front end of the speaker encoder (QWEN3_TTS_FACTS.md §9), with our own Slaney filterbank.

Frames: the signal is reflect-padded by (n_fft - hop) / 2 on each side, then framed without centring,
so T samples give (T + 2 * pad - n_fft) // hop + 1 frames. Per frame: periodic Hann window, |rfft| with
a 1e-9 floor under the square root, Slaney-normalised mel weights, natural log clamped at 1e-5.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..errors import InvalidInputError

# Slaney's auditory-toolbox mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_BREAK_HZ = 1000.0
_BREAK_MEL = _BREAK_HZ / _LINEAR_HZ_PER_MEL  # 15
_LOG_STEP = np.log(6.4) / 27.0  # mels per log-Hz step above the break

SPEAKER_MEL = dict(sample_rate=24000, n_fft=1024, n_mels=128, hop=256, win=1024, fmin=0.0, fmax=12000.0)


def hz_to_mel(hz) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _LINEAR_HZ_PER_MEL
    high = hz >= _BREAK_HZ
    return np.where(high, _BREAK_MEL + np.log(np.maximum(hz, _BREAK_HZ) / _BREAK_HZ) / _LOG_STEP, mel)


def mel_to_hz(mel) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = mel * _LINEAR_HZ_PER_MEL
    high = mel >= _BREAK_MEL
    return np.where(high, _BREAK_HZ * np.exp(_LOG_STEP * (np.maximum(mel, _BREAK_MEL) - _BREAK_MEL)), hz)


@lru_cache(maxsize=8)
def slaney_mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None) -> np.ndarray:
    """Triangular mel filters [n_mels, n_fft // 2 + 1] (float32), each scaled to unit area in Hz (x 2).

    Band edges are n_mels + 2 points equally spaced on the Slaney mel scale between fmin and fmax; filter
    i rises from edge i to edge i+1 and falls to edge i+2. Built in float64, rounded to float32 before the
    area normalisation is applied (the order the reference implementation uses).
    """
    fmax = sample_rate / 2.0 if fmax is None else float(fmax)
    bins_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(edges)
    rise = (bins_hz[None, :] - edges[:-2, None]) / widths[:-1, None]
    fall = (edges[2:, None] - bins_hz[None, :]) / widths[1:, None]
    tri = np.maximum(0.0, np.minimum(rise, fall)).astype(np.float32)
    area = 2.0 / (edges[2:] - edges[:-2])
    return (tri * area[:, None]).astype(np.float32)


def log_mel_spectrogram(
    wav: torch.Tensor,
    *,
    sample_rate: int = 24000,
    n_fft: int = 1024,
    n_mels: int = 128,
    hop: int = 256,
    win: int = 1024,
    fmin: float = 0.0,
    fmax: float | None = 12000.0,
) -> torch.Tensor:
    """Float32 log-mel spectrogram [B, n_mels, frames] of wav [B, T] (or [T] -> [1, n_mels, frames])."""
    if wav.ndim == 1:
        wav = wav[None]
    wav = wav.to(torch.float32)
    pad = (n_fft - hop) // 2
    if wav.shape[-1] <= pad or wav.shape[-1] + 2 * pad < n_fft:
        raise InvalidInputError(
            f"audio of {wav.shape[-1]} samples is too short for a mel spectrogram; use at least 1 s of audio."
        )
    basis = torch.from_numpy(slaney_mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax)).to(wav.device)
    window = torch.hann_window(win, dtype=torch.float32, device=wav.device)
    padded = torch.nn.functional.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(
        padded, n_fft, hop_length=hop, win_length=win, window=window, center=False,
        normalized=False, onesided=True, return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, magnitude), min=1e-5))
