"""Reference recordings at any rate, written as real files, and their clone-parity figures against the official
qwen-tts 0.1.1 (used by tests/engine/test_resample_parity.py).

Each engine reads the file its own way, as a user's run would: ours through `engine.audio.load_wav`, the
oracle through its `create_voice_clone_prompt(ref_audio=path)` (librosa.load, then librosa.resample).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine import Request
from engine.audio import load_wav, prepare_reference
from tests.support.decoding import oracle_greedy

RATES = (8000, 16000, 22050, 44100, 48000)
REF_TEXT = "This is the reference speech."
TEXT = "Clone this voice, please."
FRAMES = 8


def voiced_signal(sr: int, seconds: float = 2.5, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A speech-like signal [C, T] at `sr`: a gliding harmonic series up to the file's Nyquist (so the
    resampler's transition band is exercised), syllable-rate envelope, light broadband noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    f0 = 140.0 + 30.0 * np.sin(2 * np.pi * 3.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, int(0.49 * sr / 170.0) + 1))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t) ** 2
    out = []
    for c in range(channels):
        x = np.roll(voiced, 7 * c) * envelope * (1.0 - 0.2 * c) + 0.02 * rng.standard_normal(n)
        out.append(x)
    x = np.stack(out)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def write_reference(path: Path, sr: int, channels: int, subtype: str) -> Path:
    """Write voiced_signal as a WAV file; subtype 'PCM_16' (int16) or 'FLOAT' (float32)."""
    import soundfile as sf

    sf.write(str(path), voiced_signal(sr, channels=channels).T, sr, subtype=subtype)
    return path


def compare(engine, oracle, path: Path) -> dict:
    """Our engine against the oracle on one reference file: resampled audio, x-vector, ICL codes, greedy codes."""
    import librosa

    x, sr = load_wav(path)
    ours_24k = prepare_reference(x, sr).numpy()
    theirs, theirs_sr = librosa.load(str(path), sr=None, mono=True)  # the oracle's own read and resample
    theirs_24k = librosa.resample(theirs, orig_sr=theirs_sr, target_sr=24000)
    same_len = ours_24k.shape == theirs_24k.shape
    row = {"rate": sr, "channels": x.shape[0], "file": path.name, "same_length": same_len,
           "audio_max_diff": float(np.abs(ours_24k - theirs_24k).max()) if same_len else float("inf")}

    params = engine.defaults.greedy().replace(max_new_tokens=FRAMES)
    for mode, ref_text in (("xvec", None), ("icl", REF_TEXT)):
        items = oracle.create_voice_clone_prompt(ref_audio=str(path), ref_text=ref_text,
                                                 x_vector_only_mode=ref_text is None)
        voice = engine.extract_voice(x, sr, ref_text=ref_text)
        emb_diff = float((voice.spk_embedding.float() - items[0].ref_spk_embedding.float()).abs().max())
        row[f"{mode}_embedding_max_diff"] = emb_diff
        if ref_text is not None:
            theirs_ref = items[0].ref_code.to(torch.long)
            row["ref_codes_equal"] = bool(voice.ref_codes.shape == theirs_ref.shape
                                          and torch.equal(voice.ref_codes, theirs_ref))
        seen, _ = oracle_greedy(oracle, "generate_voice_clone", FRAMES, text=TEXT, language="English",
                                voice_clone_prompt=items)
        theirs_codes = seen[0].to(torch.long)
        ours = engine.generate(Request(mode="clone", text=TEXT, language="English", voice=voice), params=params)
        if ref_text is not None:  # the oracle hands its codec the reference frames first
            theirs_codes = theirs_codes[items[0].ref_code.shape[0]:]
        row[f"{mode}_codes_equal"] = bool(ours.codes[0].shape == theirs_codes.shape
                                          and torch.equal(ours.codes[0], theirs_codes))
    return row
