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
    assert res["frames"] == 6 and res["takes"] == 2 and res["random_weights"] is True  # RANDOM_WEIGHTS.json
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


@pytest.mark.parametrize("first,takes,says", [(-1, 1, "must be between 0 and 4294967295 (got -1)"),
                                              (2**32 - 1, 2, "with --takes 2 the first take is at most 4294967294"),
                                              (2**32, 1, "with --takes 1 the first take is at most 4294967295")])
def test_first_take_out_of_the_stream_range_is_a_clear_error(tiny_checkpoints, tmp_path, capsys, first, takes, says):
    rc, _, err = synth_here(capsys, "--model", str(tiny_checkpoints["custom_voice"]), "--max-new-tokens", "2",
                            "--takes", str(takes), "--first-take", str(first), "--out", str(tmp_path / "x.wav"))
    assert rc == 2 and err.startswith("error: --first-take") and says in err


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


@pytest.fixture
def no_synthesis(monkeypatch):
    """Fails the test if the CLI gets as far as loading or synthesising."""
    from engine import cli

    def refuse(args):
        raise AssertionError("the CLI went on to synthesise")

    monkeypatch.setattr(cli, "synth", refuse)


@pytest.mark.parametrize("args,says", [
    (["--out", "{tmp}/missing_dir/x.wav"], ("--out {tmp}/missing_dir/x.wav: the folder {tmp}/missing_dir does not "
                                             "exist. Create it first")),
    (["--takes", "3", "--out", "{tmp}/missing_dir/x.wav"], "--out {tmp}/missing_dir/x_take0.wav: the folder"),
    (["--out", "{tmp}"], "--out {tmp} is a directory; give a file name"),
    (["--out", "{tmp}/a_file/x.wav"], "the folder {tmp}/a_file is not a folder"),
    (["--codes-out", "{tmp}/nowhere/c.npy"], "--codes-out {tmp}/nowhere/c.npy: the folder {tmp}/nowhere does not"),
    (["--codes-out", "{tmp}/nowhere/c"], "--codes-out {tmp}/nowhere/c.npy: the folder"),  # numpy adds .npy
    (["--out", "{tmp}/c.npy", "--codes-out", "{tmp}/c"], "--codes-out {tmp}/c would overwrite a WAV file"),
])
def test_output_paths_are_checked_before_any_synthesis(tmp_path, capsys, no_synthesis, args, says):
    (tmp_path / "a_file").write_text("")
    rc, _, err = synth_here(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert rc == 2 and err.startswith("error: ") and says.format(tmp=tmp_path) in err, err
    assert "Traceback" not in err


def test_an_unwritable_output_folder_is_refused_before_any_synthesis(tmp_path, capsys, no_synthesis, monkeypatch):
    import os

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    rc, _, err = synth_here(capsys, "--out", str(tmp_path / "x.wav"))
    assert rc == 2 and f"the folder {tmp_path} is not writable" in err


def test_missing_output_folder_exits_cleanly_in_a_fresh_interpreter(tmp_path):
    """What a user types: no traceback, exit status 2, and it fails at once instead of after the synthesis."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "engine", "synth", "--out", "missing_dir/x.wav"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: --out missing_dir/x.wav: the folder missing_dir does not exist")
    assert not (tmp_path / "cache").exists(), "nothing may be loaded or written before the paths are checked"


@pytest.mark.parametrize("args,says", [
    (["--takes", "0"], "--takes must be between 1 and 16 (got 0)"),
    (["--takes", "17"], "--takes must be between 1 and 16 (got 17)"),
    (["--seed", "-1"], "--seed must be between 0 and 18446744073709551615 (got -1)"),
    (["--chunk-frames", "0"], "--chunk-frames must be between 1 and"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be between 1 and"),
    (["--temperature", "0"], "--temperature must be a finite number in (0, 100] (got 0.0)"),
    (["--top-k", "-1"], "--top-k must be between 0 and"),
    (["--top-p", "1.5"], "--top-p must be a finite number in (0, 1] (got 1.5)"),
    (["--repetition-penalty", "nan"], "--repetition-penalty must be a finite number in (0, 100]"),
    (["--model", "{tmp}/nope"], "--model {tmp}/nope is not a folder"),
    (["--codec-dir", "{tmp}/nope"], "--codec-dir {tmp}/nope is not a folder"),
    (["--mode", "clone", "--ref-audio", "{tmp}/nope.wav"], "--ref-audio {tmp}/nope.wav does not exist"),
    (["--mode", "clone", "--voice", "{tmp}/nope.safetensors"], "--voice {tmp}/nope.safetensors does not exist"),
])
def test_options_are_checked_before_loading_and_name_the_option(tmp_path, capsys, no_synthesis, args, says):
    rc, _, err = synth_here(capsys, *[a.format(tmp=tmp_path) for a in args], "--out", str(tmp_path / "x.wav"))
    assert rc == 2 and err.startswith("error: ") and says.format(tmp=tmp_path) in err, err
    for node_word in ("node", "widget", "max_takes", "first_take"):
        assert node_word not in err, err


def test_a_mode_the_checkpoint_cannot_do_names_the_options(tiny_checkpoints, tmp_path, capsys, no_synthesis):
    rc, _, err = synth_here(capsys, "--model", str(tiny_checkpoints["custom_voice"]), "--mode", "clone",
                            "--out", str(tmp_path / "x.wav"))
    assert rc == 2 and "--mode clone needs a Base checkpoint" in err and "Leave --mode out" in err
    assert "node" not in err


def test_a_random_checkpoint_given_to_model_is_reported_random(tiny_checkpoints, tmp_path, capsys):
    import shutil

    from engine.checkpoint.writer import MANIFEST

    rc, res, err = synth_here(capsys, "--model", str(tiny_checkpoints["custom_voice"]), "--max-new-tokens", "2",
                              "--out", str(tmp_path / "r.wav"))
    assert rc == 0 and res["random_weights"] is True and "RANDOM weights" in err and "noise" in err
    real = shutil.copytree(tiny_checkpoints["custom_voice"], tmp_path / "unmarked")  # as a real checkpoint is
    (real / MANIFEST).unlink()
    rc, res, err = synth_here(capsys, "--model", str(real), "--max-new-tokens", "2", "--out", str(tmp_path / "u.wav"))
    assert rc == 0 and res["random_weights"] is False and "RANDOM" not in err


def test_every_option_has_help_text_and_shows_its_default():
    import argparse

    from engine import cli

    parser = cli._parser()
    synth_parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["synth"]
    formatter = synth_parser._get_formatter()
    options = [a for a in synth_parser._actions if a.option_strings and a.dest != "help"]
    assert len(options) > 20
    for action in options:
        text = formatter._expand_help(action) if action.help else ""
        assert action.help and action.help.strip(), f"{action.option_strings[0]} has no help text"
        assert "default" in text.lower(), f"{action.option_strings[0]} does not show its default: {text!r}"
        assert "(default: None)" not in text, f"{action.option_strings[0]}: say what no value means"
    full = synth_parser.format_help()
    assert "(default: 1)" in full and "(default: out.wav)" in full and "(default: off)" in full
