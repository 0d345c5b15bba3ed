"""Audio utilities: WAV read/write (stdlib), mono mixdown, resampling (soxr), reference checks.

Layout convention: multichannel audio is [C, T] (channels first), as in ComfyUI's AUDIO waveform. Upstream
reads files as [T, C] and averages the last axis; `to_mono` does the same average on our layout.

Reference preparation as upstream does it (qwen-tts 0.1.1): mono average, then resample to 24 kHz with
soxr HQ and librosa's output length, which gives upstream's samples bit for bit
(tests/engine/test_resample_parity.py). No loudness normalisation, no silence trimming, no clipping.
"""
from __future__ import annotations

import io
import math
import struct
import wave
from pathlib import Path

import numpy as np
import soxr
import torch

from . import files
from .errors import InvalidInputError, ReferenceAudioError

# WAVE format tags (RIFF "fmt " chunk).
_FMT_PCM = 0x0001
_FMT_FLOAT = 0x0003
_FMT_EXTENSIBLE = 0xFFFE

MIN_REFERENCE_SECONDS = 1.0
MAX_REFERENCE_SECONDS = 60.0  # longer adds nothing to an x-vector and no longer fits an ICL prompt
MIN_REFERENCE_RATE, MAX_REFERENCE_RATE = 4000, 768000  # Hz: below, no speech band is left; above, no recorder
SILENCE_PEAK = 1e-4
MAX_PEAK = 16.0  # +24 dBFS: no float recording gets there; unscaled int16 PCM does
MAX_CHANNELS = 32


# ----------------------------------------------------------------------------------------------------------
# WAV files
# ----------------------------------------------------------------------------------------------------------

MAX_WAV_SAMPLES = 1 << 26  # samples of all channels in one file: 60 s of stereo at 559 kHz; 256 MB as float32
MAX_WAV_CHUNKS = 1024  # chunks before the audio; real files have a handful
MAX_FMT_BYTES = 1024  # a 'fmt ' chunk is 16, 18 or 40 bytes
PIECE_BYTES = 4 << 20  # the data chunk is read and decoded this much at a time


def _damaged(path, what: str) -> InvalidInputError:
    return InvalidInputError(f"{path}: {what}; the file is damaged or its header is wrong. Re-export it (e.g. as "
                             "16-bit PCM WAV).")


def _find_chunks(fh, size: int, path) -> tuple[bytes, int, int, bool]:
    """(the 'fmt ' payload, where the audio starts, its declared bytes, whether its size was left open) of an
    open RIFF/WAVE file of `size` bytes, found by seeking from chunk header to chunk header: only the headers
    and the 'fmt ' payload are read. A size of 0xFFFFFFFF (streamed and RF64 writers) means the rest of the
    file; any other size past the end of the file is refused."""
    head = fh.read(12)
    if len(head) < 12 or head[0:4] not in (b"RIFF", b"RF64") or head[8:12] != b"WAVE":
        raise InvalidInputError(f"{path} is not a WAV file (no RIFF/WAVE header); convert it to WAV first.")
    fmt = data = None
    pos = 12
    for _ in range(MAX_WAV_CHUNKS):
        if pos + 8 > size:
            break
        fh.seek(pos)
        cid, n = fh.read(4), struct.unpack("<I", fh.read(4))[0]
        start = pos + 8
        if cid == b"data" and n == 0xFFFFFFFF:
            n = size - start
            data = data or (start, n, True)
        elif start + n > size:
            raise _damaged(path, f"its {cid.decode('latin-1')!r} chunk declares {n:,} bytes but the file ends "
                                 f"{size - start:,} bytes after the chunk header")
        elif cid == b"data":
            data = data or (start, n, False)
        elif cid == b"fmt " and fmt is None:
            if n > MAX_FMT_BYTES:
                raise _damaged(path, f"its 'fmt ' chunk declares {n:,} bytes (a 'fmt ' chunk has 16 to 40)")
            fmt = fh.read(n)
        if fmt is not None and data is not None:
            return fmt, *data
        pos = start + n + (n & 1)  # chunks are word aligned
    else:
        raise _damaged(path, f"more than {MAX_WAV_CHUNKS} chunks come before its audio")
    raise InvalidInputError(f"{path} is a damaged WAV file (missing the 'fmt ' or 'data' chunk).")


def _decoder(tag: int, width: int, path):
    """bytes of little-endian samples -> float32 in [-1, 1], for the encodings the reader supports."""
    if tag == _FMT_PCM and width == 1:
        return lambda raw: (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    if tag == _FMT_PCM and width == 2:
        return lambda raw: np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    if tag == _FMT_PCM and width == 3:
        def int24(raw):
            b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
            v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
            return np.where(v >= 1 << 23, v - (1 << 24), v).astype(np.float32) / float(1 << 23)
        return int24
    if tag == _FMT_PCM and width == 4:
        return lambda raw: (np.frombuffer(raw, "<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    if tag == _FMT_FLOAT and width == 4:
        return lambda raw: np.frombuffer(raw, "<f4").astype(np.float32)
    if tag == _FMT_FLOAT and width == 8:
        def float64(raw):
            with np.errstate(over="ignore"):  # beyond float32 becomes inf, which the reference checks refuse
                return np.frombuffer(raw, "<f8").astype(np.float32)
        return float64
    kind = {_FMT_PCM: "integer PCM", _FMT_FLOAT: "float"}.get(tag, f"format tag {tag:#06x}")
    raise InvalidInputError(
        f"{path}: unsupported WAV encoding ({kind}, {8 * width}-bit). Supported: 8/16/24/32-bit integer PCM "
        "and 32/64-bit float; convert the file (e.g. to 16-bit PCM WAV)."
    )


def _plan(fh, size: int, path, max_seconds: float | None):
    """(channels, rate, frames, where the audio starts, bytes a frame, decoder) of an open WAV file, after every
    check load_wav makes; only the chunk headers and the 'fmt ' chunk are read."""
    fmt, start, nbytes, open_size = _find_chunks(fh, size, path)
    if len(fmt) < 16:
        raise InvalidInputError(f"{path} has a truncated 'fmt ' chunk; re-export the file.")
    tag, channels, sr, _, block_align, bits = struct.unpack_from("<HHIIHH", fmt, 0)
    if tag == _FMT_EXTENSIBLE and len(fmt) >= 26:
        (tag,) = struct.unpack_from("<H", fmt, 24)  # first two bytes of the sub-format GUID
    if channels < 1 or sr < 1:
        raise _damaged(path, f"its header declares {channels} channels at {sr} Hz")
    width = (bits + 7) // 8
    if bits < 1 or block_align != channels * width:
        raise _damaged(path, f"its header declares {bits}-bit samples in {channels} channels, which take "
                             f"{channels * width} bytes a frame, but frames of {block_align} bytes")
    decode = _decoder(tag, width, path)
    if nbytes % block_align and not open_size:  # an open size runs to the end of the file: drop a partial frame
        raise _damaged(path, f"its data chunk of {nbytes:,} bytes is not a whole number of {block_align}-byte "
                             "frames")
    frames = nbytes // block_align
    seconds = frames / sr
    if max_seconds is not None and seconds > max_seconds:
        raise ReferenceAudioError(f"{path} is {seconds:.0f} s long ({frames:,} frames at {sr} Hz); trim it to "
                                  f"at most {max_seconds:g} s (3-10 s of clean speech from one speaker works "
                                  "best).")
    if frames * channels > MAX_WAV_SAMPLES:
        raise InvalidInputError(f"{path} holds {frames * channels:,} samples ({channels} channels, {seconds:.0f} s "
                                f"at {sr} Hz), more than the {MAX_WAV_SAMPLES:,} the reader takes; trim it or "
                                "convert it to mono at 24 or 48 kHz.")
    return channels, int(sr), frames, start, block_align, decode


def check_wav(path, max_seconds: float | None = MAX_REFERENCE_SECONDS) -> tuple[int, int, int]:
    """(channels, rate, frames) of a WAV file after every check `load_wav` makes, without reading its audio:
    what the CLI runs before it loads a model."""
    path = Path(path)
    size = files.input_file(path, "audio file").st_size
    with open(path, "rb") as fh:
        return _plan(fh, size, path, max_seconds)[:3]


def load_wav(path, max_seconds: float | None = MAX_REFERENCE_SECONDS) -> tuple[np.ndarray, int]:
    """Read a WAV file as float32 samples [C, T] in [-1, 1] and its sample rate.

    Supports PCM 8/16/24/32-bit integer and 32/64-bit IEEE float, plain or WAVE_FORMAT_EXTENSIBLE.
    Integers are scaled by 1/2^(bits-1), the same scaling soundfile/librosa use, so the samples equal
    what the upstream loader would see.

    Everything is checked before the audio is read: the path is a regular file; the header agrees with itself
    (block align = channels x bytes per sample, a rate above 0, whole frames, every chunk inside the file);
    the audio is at most `max_seconds` long (None: no limit) and MAX_WAV_SAMPLES samples. Then the data chunk
    alone is read, piece by piece, so memory is the decoded audio and one piece, whatever the file's size.
    """
    path = Path(path)
    size = files.input_file(path, "audio file").st_size
    with open(path, "rb") as fh:
        return _read(fh, size, path, max_seconds)


def decode_wav(data: bytes, name: str = "the audio",
               max_seconds: float | None = MAX_REFERENCE_SECONDS) -> tuple[np.ndarray, int]:
    """`load_wav` of a WAV file's bytes (an upload, say), with the same checks; `name` names it in messages."""
    return _read(io.BytesIO(data), len(data), name, max_seconds)


def _read(fh, size: int, path, max_seconds: float | None) -> tuple[np.ndarray, int]:
    channels, sr, frames, start, block_align, decode = _plan(fh, size, path, max_seconds)
    out = np.empty((channels, frames), np.float32)
    step = max(1, PIECE_BYTES // block_align)
    fh.seek(start)
    for first in range(0, frames, step):
        count = min(step, frames - first)
        raw = fh.read(count * block_align)
        if len(raw) != count * block_align:  # the file shrank while it was read
            raise _damaged(path, "it ended before its data chunk did")
        out[:, first:first + count] = decode(raw).reshape(count, channels).T
    return out, sr


def pcm16(samples) -> np.ndarray:
    """Samples [T] or [C, T] (float, nominally in [-1, 1]; numpy or torch) as int16 [C, T]: scaled by 32768,
    rounded and clipped, so a 16-bit file read with `load_wav` and written again is bit-identical. float32 samples
    (the engine's audio) stay float32: scaling by a power of two is exact, so they round as in float64, with no
    copy to float64 (a server converts every chunk it streams)."""
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().cpu()
        samples = samples.numpy() if samples.dtype in (torch.float32, torch.float64) else samples.double().numpy()
    x = np.asarray(samples)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise InvalidInputError(f"audio samples must be shaped [T] or [C, T], got shape {tuple(x.shape)}.")
    if not np.isfinite(x).all():
        raise InvalidInputError("the audio contains NaN or Inf values; nothing was written.")
    y = np.clip(x, -2.0, 2.0)  # past ±1 a sample clips to the same end; bounded, the scaling cannot overflow
    y *= 32768.0
    np.rint(y, out=y)
    np.clip(y, -32768, 32767, out=y)
    return y.astype("<i2")


def wav_bytes(samples, sr: int) -> bytes:
    """A 16-bit PCM WAV file of samples [T] or [C, T] (see `pcm16`), as bytes."""
    pcm = pcm16(samples)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(pcm.shape[0])
        w.setsampwidth(2)
        w.setframerate(int(sr))
        w.writeframes(np.ascontiguousarray(pcm.T).tobytes())
    return out.getvalue()


def float_wav_bytes(samples, sr: int) -> bytes:
    """A 32-bit float WAV file of samples [T] or [C, T], as bytes: the samples unrounded (a reference sent to a
    server is read back exactly)."""
    x = samples.detach().cpu().float().numpy() if isinstance(samples, torch.Tensor) else np.asarray(samples)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.dtype.kind not in "fiu":
        raise InvalidInputError(f"the reference audio must be samples [T] or [channels, T], not an array of shape "
                                f"{tuple(x.shape)} ({x.dtype}).")
    data = np.ascontiguousarray(x.astype("<f4").T).tobytes()
    channels = x.shape[0]
    fmt = struct.pack("<HHIIHH", _FMT_FLOAT, channels, sr, sr * 4 * channels, 4 * channels, 32)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt "
            + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)


def save_wav(path, samples, sr: int) -> None:
    """Write samples [T] or [C, T] as a 16-bit PCM WAV file (see `pcm16`). Nothing is written if they are
    unusable, and the path is never a directory, FIFO or device."""
    path = files.output_file(path, "WAV file")
    data = wav_bytes(samples, sr)
    Path(path).write_bytes(data)


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

def resample(x, sr_in: int, sr_out: int) -> torch.Tensor:
    """Resample mono audio [T] (torch or numpy) from sr_in to sr_out Hz as upstream does: librosa.resample's
    default, soxr "HQ" on float32 samples, padded with zeros or cut to ceil(T * (sr_out / sr_in)) evaluated
    in float64. soxr alone can be a sample short (32 kHz -> 24 kHz), and the codec's frame count
    ceil(len / 1920) depends on the length, so the length rule is part of the parity."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ReferenceAudioError(f"resample expects mono audio shaped [T], got shape {tuple(x.shape)}.")
    sr_in, sr_out = int(sr_in), int(sr_out)
    if sr_in == sr_out:
        return torch.from_numpy(x.copy())
    try:
        y = soxr.resample(x, sr_in, sr_out, "HQ")
    except (ValueError, RuntimeError) as exc:
        raise ReferenceAudioError(
            f"cannot resample {x.shape[0]} samples from {sr_in} Hz to {sr_out} Hz ({exc}); "
            "convert the file to 16-bit PCM WAV at 24000 or 48000 Hz and try again."
        ) from exc
    n_out = math.ceil(x.shape[0] * (sr_out / sr_in))
    out = np.zeros(n_out, dtype=np.float32)
    out[: min(n_out, y.shape[0])] = y[:n_out]
    return torch.from_numpy(out)


# ----------------------------------------------------------------------------------------------------------
# Reference audio
# ----------------------------------------------------------------------------------------------------------

def _reference_rate(sr) -> int:
    """The sample rate as an int, if it is a whole number of Hz that a recording can have."""
    try:
        rate = float(sr)
    except (TypeError, ValueError):
        rate = float("nan")
    if not math.isfinite(rate) or rate != int(rate) or not MIN_REFERENCE_RATE <= rate <= MAX_REFERENCE_RATE:
        raise ReferenceAudioError(
            f"reference audio has an invalid sample rate ({sr!r}); it must be a whole number of Hz from "
            f"{MIN_REFERENCE_RATE} to {MAX_REFERENCE_RATE}. Check the file's header or whatever produced the audio."
        )
    return int(rate)


_DTYPE_HINT = ("reference audio must hold float samples in [-1, 1], not {dtype}; convert integer PCM first "
               "(int16: divide by 32768) or read the file with engine.audio.load_wav.")


def _waveform(x) -> np.ndarray:
    """The reference as a float array [C, T], or ReferenceAudioError saying what shape and type to pass."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            raise ReferenceAudioError(_DTYPE_HINT.format(dtype=str(x.dtype).replace("torch.", "")))
        x = x.detach().to("cpu", torch.float32).numpy()
    try:
        x = np.asarray(x)
    except (ValueError, TypeError) as exc:  # ragged nested lists and the like
        raise ReferenceAudioError(f"reference audio must be an array of samples ({exc}).") from exc
    if x.dtype.kind != "f":
        raise ReferenceAudioError(_DTYPE_HINT.format(dtype=x.dtype))
    if x.ndim not in (1, 2):
        raise ReferenceAudioError(
            f"reference audio must be a waveform shaped [T] or [channels, T]; got shape {tuple(x.shape)}. "
            "From a ComfyUI AUDIO batch [B, C, T] pass one item."
        )
    if x.size == 0:
        raise ReferenceAudioError("reference audio is empty (no samples); check the file or whatever produced it.")
    if x.ndim == 2 and x.shape[0] > MAX_CHANNELS:
        raise ReferenceAudioError(
            f"reference audio has shape {tuple(x.shape)}, i.e. {x.shape[0]} channels. Pass it as [channels, T]; "
            "an array read as [T, channels] (soundfile's layout) must be transposed first."
        )
    return x if x.dtype == np.float64 else x.astype(np.float32)  # float64 is mixed in float64


def validate_reference(x, sr: int) -> int:
    """Raise ReferenceAudioError unless x (mono [T] or [C, T], float, torch or numpy) at sr Hz is usable
    reference audio: finite, 1 s to MAX_REFERENCE_SECONDS long, scaled to about [-1, 1], not silent once mixed
    to mono (stereo whose channels cancel out is refused too). Return the rate as an int."""
    x = _waveform(x)
    sr = _reference_rate(sr)
    if not np.isfinite(x).all():
        raise ReferenceAudioError(
            "reference audio contains NaN or Inf samples; re-export it or check whatever produced it."
        )
    seconds = x.shape[-1] / float(sr)
    if seconds < MIN_REFERENCE_SECONDS:
        raise ReferenceAudioError(
            f"reference audio is {seconds:.2f} s long, shorter than {MIN_REFERENCE_SECONDS:g} s; use at least "
            f"{MIN_REFERENCE_SECONDS:g} s (3-10 s of clean speech from one speaker works best)."
        )
    if seconds > MAX_REFERENCE_SECONDS:
        raise ReferenceAudioError(
            f"reference audio is {seconds:.0f} s long; trim it to at most {MAX_REFERENCE_SECONDS:g} s "
            "(3-10 s of clean speech from one speaker works best)."
        )
    peak = float(np.abs(x).max())
    if peak > MAX_PEAK:
        raise ReferenceAudioError(
            f"reference audio peaks at {peak:g}, far outside [-1, 1]: integer PCM was probably converted to float "
            "without scaling; divide int16 samples by 32768."
        )
    mono_peak = float(np.abs(to_mono(x)).max())
    if mono_peak < SILENCE_PEAK:
        raise ReferenceAudioError(
            f"reference audio is silent (peak {mono_peak:.1e}); check the file, the input channel, or the volume."
        )
    return sr


def prepare_reference(x, sr: int, target_sr: int = 24000) -> torch.Tensor:
    """Validate, mix to mono and resample to target_sr: the preparation upstream applies (no normalising)."""
    sr = validate_reference(x, sr)
    return resample(to_mono(_waveform(x)), sr, target_sr)
