"""Every text and audio path runs in time linear in its input: the tokenizer, the sentence splitter and its hard
cut, the script and voice-table parsers, the SRT writer and the track layout, reference preparation
(mixdown, checks, resampling) and WAV reading.

Each path runs at n and at 10n in the same process and the two times are compared, never an absolute time: a
quadratic path gives a ratio near 100, a linear one 8 to 30 (caches and allocation make a larger input cost
more per byte; sizes are chosen so both runs are in the same memory regime where possible). Each time is the
fastest of a few runs (of `batch` calls each, for calls too short to time alone), and a ratio over the limit is
measured again (up to ATTEMPTS times) before it fails, so a busy machine cannot fail the test but a
super-linear path fails it every time. The inputs are the shapes that break naive code: runs
with no break, thousands of tiny clauses, long blanks where a pattern backtracks, many lines.
"""
from __future__ import annotations

import contextlib
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from engine import audio
from engine.text_tokenizer import TextTokenizer
from tests.support._q3support import load_pure

SCALE = 10
LIMIT = 40  # for 10x the input: linear measures 8-30, quadratic ~100, cubic ~1000
ATTEMPTS = 3
DEADLINE_S = 120  # one path's measurements: a path gone cubic fails here instead of hanging the run
RESULTS: dict[str, float] = {}

ts, sp, srt, track = (load_pure(m) for m in ("text_split", "script_parse", "srt", "script_track"))


@dataclass
class Path:
    name: str
    run: Callable  # run(input)
    make: Callable  # make(n) -> input of size ~n
    n: int
    batch: int = 1  # calls per timing


def _fastest(fn, arg, batch: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(batch):
            fn(arg)
        best = min(best, time.perf_counter() - t)
    return best


def _ratio(path: Path) -> float:
    small, large = path.make(path.n), path.make(SCALE * path.n)
    path.run(small)  # warm caches and lazy imports outside the timing
    return _fastest(path.run, large, path.batch) / _fastest(path.run, small, path.batch, repeats=5)


def _refused(fn):
    def run(arg):
        try:
            fn(arg)
        except ValueError:  # the parsers' ScriptError: refusing must be linear too
            return
    return run


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoints):
    return TextTokenizer.from_dir(tiny_checkpoints["custom_voice"])


def _text_paths(tok) -> list[Path]:
    """`tok` is used only when a path runs (None lists the paths)."""
    def split(t):
        return ts.split_text(t, 400)

    def encode(t):
        return tok.encode(t)

    return [
        Path("tokenizer: words", encode, lambda n: "Hello world, this is some text. " * (n // 32), 20_000),
        Path("tokenizer: run with no break", encode, lambda n: "x" * n, 20_000),
        Path("tokenizer: CJK run", encode, lambda n: "語" * n, 20_000),
        Path("tokenizer: digits", encode, lambda n: "1" * n, 20_000),
        Path("splitter: sentences", split, lambda n: "One short sentence here. " * (n // 25), 50_000),
        Path("splitter: line breaks", split, lambda n: "a line\n\n" * (n // 8), 50_000),
        Path("hard cut: run with no break", split, lambda n: "x" * n, 50_000),
        Path("hard cut: CJK run", split, lambda n: "語" * n, 20_000),
        Path("hard cut: blanks", split, lambda n: "a" + " " * n + "b", 50_000),
        Path("hard cut: tiny clauses", split, lambda n: "a," * (n // 2), 30_000),
        Path("script: many lines", sp.parse_script, lambda n: "Alice [calm]: Hello there.\n" * (n // 27), 60_000),
        Path("script: one long line", sp.parse_script, lambda n: "Alice: " + "word " * (n // 5), 20_000, 20),
        Path("script: blanks and no colon", _refused(sp.parse_script), lambda n: "A" + " " * n + "b", 20_000, 20),
        Path("script: blanks in a pause tag", _refused(sp.parse_script), lambda n: "[pause" + " " * n + "1", 20_000,
             20),
        Path("script: unclosed instruction", _refused(sp.parse_script), lambda n: "A [" + " " * n + ": x", 20_000, 20),
        Path("voices table: many names", sp.parse_cast,
             lambda n: "".join(f"Name{i} = Ryan\n" for i in range(n // 14)), 100_000),
        Path("SRT: many cues", lambda c: srt.to_srt(c, 24000),
             lambda n: [(i * 2400, i * 2400 + 1200, "Alice: hello there") for i in range(n // 20)], 100_000),
        Path("SRT: one long cue", lambda c: srt.to_srt(c, 24000), lambda n: [(0, 24000, "word\n" * (n // 5))],
             10_000, 10),
        Path("script silence total", lambda ev: track.total_silence_ms(ev, 300),
             lambda n: sp.parse_script("A: hi\n[pause 1ms]\n" * (n // 18)), 60_000),
    ]


@pytest.mark.parametrize("index", range(len(_text_paths(None))), ids=[p.name for p in _text_paths(None)])
def test_text_path_is_linear(tokenizer, index):
    _check(_text_paths(tokenizer)[index])


@contextlib.contextmanager
def _deadline(name: str):
    def expire(*_):
        raise AssertionError(f"{name}: still running after {DEADLINE_S} s; the path is far from linear")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _check(path: Path) -> None:
    ratios = []
    with _deadline(path.name):
        for _ in range(ATTEMPTS):
            ratios.append(_ratio(path))
            if ratios[-1] < LIMIT:
                break
    RESULTS[path.name] = round(min(ratios), 1)
    assert min(ratios) < LIMIT, f"{path.name}: {SCALE}x the input took {ratios}x the time (limit {LIMIT})"


# ---------------------------------------------------------------------------------------------------------
# audio

def _stereo(seconds: float, sr: int) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    left = 0.3 * np.sin(2 * np.pi * 180 * t)
    return np.stack([left, 0.5 * left + 0.01]).astype(np.float32)


def _wav_bytes(x: np.ndarray, sr: int, width: int = 2) -> bytes:
    """[C, T] as integer PCM of `width` bytes."""
    v = np.clip(np.rint(x * (2 ** (8 * width - 1) - 1)), -(2 ** (8 * width - 1)), 2 ** (8 * width - 1) - 1)
    data = v.astype("<i4").T.tobytes() if width == 4 else b"".join(
        int(s).to_bytes(width, "little", signed=True) for s in v.astype(np.int64).T.reshape(-1))
    fmt = struct.pack("<HHIIHH", 1, x.shape[0], sr, sr * width * x.shape[0], width * x.shape[0], 8 * width)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data"
            + struct.pack("<I", len(data)) + data)


def _audio_paths(tmp) -> list[Path]:
    """Sizes where n and 10n cost the same per byte (see the module docstring): the preparation from 1.5 s,
    the WAV files small enough to stay out of the allocator's large-block regime (8 kHz mono, 6 s and 60 s,
    within the reference limit)."""
    def wav_file(width):
        def make(seconds):
            path = tmp / f"ref_{width}_{seconds}.wav"
            path.write_bytes(_wav_bytes(_stereo(seconds, 8000)[:1], 8000, width))
            return path
        return make

    return [
        Path("reference: preparation, 44.1 kHz stereo", lambda x: audio.prepare_reference(x, 44100),
             lambda n: _stereo(n, 44100), 1.5, 3),
        Path("reference: preparation, 24 kHz mono (no resampling)", lambda x: audio.prepare_reference(x, 24000),
             lambda n: torch.from_numpy(_stereo(n, 24000)[0]), 2, 10),
        Path("WAV reading: 16-bit PCM", audio.load_wav, wav_file(2), 6, 10),
        Path("WAV reading: 24-bit PCM", audio.load_wav, wav_file(3), 6, 10),
    ]


@pytest.mark.parametrize("index", range(len(_audio_paths(None))), ids=[p.name for p in _audio_paths(None)])
def test_audio_path_is_linear(tmp_path, index):
    torch.set_num_threads(1)
    _check(_audio_paths(tmp_path)[index])


def test_summary(figure):
    assert RESULTS, "run with the other tests of this file"
    figure(paths=len(RESULTS), worst=max(RESULTS, key=RESULTS.get), worst_ratio=max(RESULTS.values()),
           limit=LIMIT, scale=SCALE, ratios=RESULTS)
