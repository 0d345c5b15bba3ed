"""`python -m engine synth` end to end on tiny random checkpoints: one JSON line, WAV files, codes."""
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


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
                   "--xvec-only", "--stream", "--chunk-frames", "3", "--max-new-tokens", "7", "--greedy",
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


def synth_here(capsys, *args):
    """The CLI in this process (no interpreter start): returns (exit status, JSON result or None, stderr)."""
    from engine import cli

    rc = cli.main(["synth", "--device", "cpu", "--dtype", "fp32", *args])
    out = capsys.readouterr()
    return rc, (json.loads(out.out.strip().splitlines()[-1]) if rc == 0 else None), out.err


def test_first_take_renders_one_take_of_a_batch_again(tiny_checkpoints, tmp_path, capsys):
    model = ["--model", str(tiny_checkpoints["custom_voice"]), "--seed", "1234", "--max-new-tokens", "8"]
    rc, res, _ = synth_here(capsys, *model, "--takes", "4", "--out", str(tmp_path / "b.wav"),
                            "--codes-out", str(tmp_path / "b.npy"))
    assert rc == 0 and res["first_take"] == 0
    batch = np.load(tmp_path / "b.npy")
    assert len({batch[i].tobytes() for i in range(4)}) == 4, "sampled takes must differ"
    for i in range(4):
        rc, res, _ = synth_here(capsys, *model, "--takes", "1", "--first-take", str(i), "--out",
                                str(tmp_path / f"t{i}.wav"), "--codes-out", str(tmp_path / f"t{i}.npy"))
        assert rc == 0 and res["seed"] == 1234 and res["first_take"] == i
        assert np.array_equal(np.load(tmp_path / f"t{i}.npy")[0], batch[i]), f"take {i}"


@pytest.mark.parametrize("first,takes,says", [(-1, 1, "must be 0 or more"),
                                              (2**32 - 1, 2, "Use a first_take of at most 4294967294"),
                                              (2**32, 1, "Use a first_take of at most 4294967295")])
def test_first_take_out_of_the_stream_range_is_a_clear_error(tiny_checkpoints, tmp_path, capsys, first, takes, says):
    rc, _, err = synth_here(capsys, "--model", str(tiny_checkpoints["custom_voice"]), "--max-new-tokens", "2",
                            "--takes", str(takes), "--first-take", str(first), "--out", str(tmp_path / "x.wav"))
    assert rc == 2 and err.startswith("error: first_take") and says in err


@pytest.mark.parametrize("model_type,official", [("custom_voice", "on"), ("base", "off")])
def test_non_streaming_mode_switch_and_official_default(tiny_checkpoints, tmp_path, capsys, model_type, official):
    """Text in the prompt (on) or fed with the frames (off) give different greedy codes; no flag = the default."""
    codes = {}
    for flag in (None, "on", "off"):
        extra = [] if flag is None else ["--non-streaming-mode", flag]
        rc, res, err = synth_here(capsys, "--model", str(tiny_checkpoints[model_type]), "--greedy",
                                  "--max-new-tokens", "6", "--out", str(tmp_path / "o.wav"),
                                  "--codes-out", str(tmp_path / "c.npy"), *extra)
        assert rc == 0, err
        assert res["non_streaming_mode"] == ((flag or official) == "on")
        codes[flag] = np.load(tmp_path / "c.npy")
    assert np.array_equal(codes[None], codes[official])
    assert not np.array_equal(codes["on"], codes["off"])
