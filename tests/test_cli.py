"""`python -m engine synth` end to end on tiny random checkpoints: one JSON line, WAV files, codes."""
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def synth(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "engine", "synth", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                            "XDG_CACHE_HOME": str(cwd / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def frames_of(path):
    with wave.open(str(path)) as w:
        assert w.getframerate() == 24000 and w.getnchannels() == 1
        return w.getnframes() // 1920


@pytest.mark.parametrize("model_type", ["custom_voice", "voice_design", "base"])
def test_synth_on_each_model(tiny_checkpoints, tmp_path, model_type):
    out = tmp_path / "o.wav"
    res, _ = synth("--model", str(tiny_checkpoints[model_type]), "--text", "Command line check.", "--takes", "2",
                   "--max-new-tokens", "6", "--out", str(out), "--codes-out", str(tmp_path / "c.npy"),
                   "--device", "cpu", "--dtype", "fp32", cwd=tmp_path)
    assert res["frames"] == 6 and res["takes"] == 2 and res["random_weights"] is False
    for key in ("audio_s", "wall_s", "rtf", "ttfa_s"):
        assert key in res
    assert [Path(p).name for p in res["outputs"]] == ["o_take0.wav", "o_take1.wav"]
    assert all(frames_of(p) == 6 for p in res["outputs"])
    codes = np.load(tmp_path / "c.npy")
    assert codes.shape == (2, 6, 16) and codes.min() >= 0 and codes.max() < 2048


def test_synth_stream_and_clone_options(tiny_checkpoints, tmp_path):
    t = np.arange(24000 * 2) / 24000
    ref = tmp_path / "ref.wav"
    from engine import audio

    audio.save_wav(ref, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 16000)
    res, _ = synth("--model", str(tiny_checkpoints["base"]), "--mode", "clone", "--ref-audio", str(ref),
                   "--xvec-only", "--stream", "--chunk-size", "3", "--max-new-tokens", "7", "--greedy",
                   "--out", str(tmp_path / "s.wav"), "--device", "cpu", "--dtype", "fp32", cwd=tmp_path)
    assert res["frames"] == 7 and res["ttfa_s"] is not None and res["ttfa_s"] <= res["wall_s"]
    assert frames_of(res["outputs"][0]) == 7


def test_synth_without_model_uses_a_labelled_random_checkpoint(tmp_path):
    res, err = synth("--out", str(tmp_path / "n.wav"), "--max-new-tokens", "4", cwd=tmp_path)
    assert res["random_weights"] is True and "RANDOM" in err and "noise" in err
    assert frames_of(res["outputs"][0]) == 4


def test_synth_reports_bad_input_as_an_error(tiny_checkpoints, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "engine", "synth", "--model", str(tiny_checkpoints["custom_voice"]),
                           "--text", "  ", "--out", str(tmp_path / "x.wav")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "error: the text is empty" in proc.stderr
