"""Files and paths the user names, on every surface that takes them: the engine API, the CLI (`engine.cli.main`,
in process) and the ComfyUI nodes (in a real in-process ComfyUI). Four classes:

* output paths are checked before the work: a missing folder, a directory, a FIFO, a device, a link to one or
  to nothing, a name too long for the file system, a NUL byte: a typed error, the special file left as it was,
  and (CLI) no model loaded;
* no silent overwrite: voice names that differ from a saved voice's only in spaces or control characters are
  refused even with overwrite on; SaveSubtitles numbers every file, whatever its prefix;
* size before work: a file of gigabytes, or a header that claims gigabytes, is refused after reading its
  header only;
* lying files: WAV headers that contradict themselves or the file, special files given as input files (a read
  that would block or never end), an empty merges.txt, all-NaN weights.

Each case is counted per class and surface; the last test records the counts (docs/RELIABILITY.md).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest
import torch

from engine import Engine, Voice, cli
from engine import audio as engine_audio
from engine import voice as engine_voice
from engine.checkpoint import reader as ckpt_reader
from engine.errors import (
    CheckpointError,
    InvalidInputError,
    OutputPathError,
    ReferenceAudioError,
    VoiceError,
)
from engine.text_tokenizer import TextTokenizer
from tests.support import comfy_nodes
from tests.support import hostile_files as H
from tests.support._q3support import need

COUNTS: Counter = Counter()  # (class, surface) -> cases run
OUTPUT, OVERWRITE, SIZE, LYING = "output paths", "overwrites", "size before work", "lying files"


def count(cls: str, surface: str) -> None:
    COUNTS[(cls, surface)] += 1


# ---------------------------------------------------------------------------------------------------------
# the CLI, in process, with a probe that fails the run if a model load starts

class _Loaded(Exception):
    """Raised by the probe: the CLI went on to load a model."""


@pytest.fixture
def no_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise _Loaded("the CLI loaded a model")

    monkeypatch.setattr(Engine, "load", classmethod(refuse))
    monkeypatch.setattr(cli, "tiny_checkpoint", refuse)


def run_cli(*argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["synth", "--device", "cpu", "--dtype", "fp32", *map(str, argv)])
    return rc, err.getvalue()


def refused(rc: int, err: str, *words: str) -> str:
    """Exit 2, one `error:` line (after the CLI's notes, if any), no traceback, and the line says `words`
    (regexes)."""
    import re

    assert rc == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert re.search(w, err), f"/{w}/ not in: {err}"
    return err


def test_the_probe_sees_a_load(tiny_checkpoints, tmp_path, no_load):
    """The control: with valid paths the CLI does reach the load, so the refusals below happen before it."""
    with pytest.raises(_Loaded):
        run_cli("--model", tiny_checkpoints["custom_voice"], "--out", tmp_path / "ok.wav")


# ---------------------------------------------------------------------------------------------------------
# class: output paths, checked before the work

OUT_TARGETS = {**{k: v for k, v in H.SPECIALS.items()},
               "dangling link": (H.dangling_link, "is a link to a missing file")}


@pytest.mark.parametrize("option", ["--out", "--codes-out"])
@pytest.mark.parametrize("what", sorted(OUT_TARGETS))
def test_cli_refuses_special_outputs_before_any_load(tiny_checkpoints, tmp_path, no_load, option, what):
    make, says = OUT_TARGETS[what]
    target = make(tmp_path, "target.npy")
    before = H.fingerprint(target)
    other = ["--out", tmp_path / "o.wav"] if option == "--codes-out" else []
    rc, err = run_cli("--model", tiny_checkpoints["custom_voice"], *other, option, target)
    refused(rc, err, f"{option} {target}", says)
    assert H.fingerprint(target) == before
    count(OUTPUT, "cli")


@pytest.mark.parametrize("option", ["--out", "--codes-out"])
@pytest.mark.parametrize("what", sorted(H.BAD_NAMES) + ["missing folder", "folder is a file"])
def test_cli_refuses_unwritable_names_before_any_load(tiny_checkpoints, tmp_path, no_load, option, what):
    if what == "missing folder":
        target, says = tmp_path / "nowhere" / "x.npy", "the folder .*nowhere does not exist"
    elif what == "folder is a file":
        (tmp_path / "file").write_text("")
        target, says = tmp_path / "file" / "x.npy", "the folder .*file is not a folder"
    else:
        make, says = H.BAD_NAMES[what]
        target = make(tmp_path, ".npy")
    other = ["--out", tmp_path / "o.wav"] if option == "--codes-out" else []
    rc, err = run_cli("--model", tiny_checkpoints["custom_voice"], *other, option, target)
    refused(rc, err, option, says)
    count(OUTPUT, "cli")


def test_cli_checks_every_take_file_name(tiny_checkpoints, tmp_path, no_load):
    """--out of 250 bytes is a valid name, but out_take0.wav of --takes 2 is not."""
    out = tmp_path / ("n" * 246 + ".wav")
    rc, err = run_cli("--model", tiny_checkpoints["custom_voice"], "--takes", "2", "--out", out)
    refused(rc, err, "--out", r"_take0\.wav", "256 bytes long")
    count(OUTPUT, "cli")


@pytest.mark.parametrize("what", sorted(OUT_TARGETS))
def test_voice_save_never_replaces_a_special_file(tmp_path, what):
    make, says = OUT_TARGETS[what]
    target = make(tmp_path, "v.safetensors")
    before = H.fingerprint(target)
    with pytest.raises(OutputPathError, match=f"voice file {target}.*{says}|{says}"):
        H.within(10, Voice(spk_embedding=torch.randn(8), model_size="0b6").save, target)
    assert H.fingerprint(target) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".voice-")] == []  # no temporary left
    count(OUTPUT, "engine")


@pytest.mark.parametrize("what", sorted(OUT_TARGETS) + sorted(H.BAD_NAMES))
def test_save_wav_never_writes_into_a_special_file(tmp_path, what):
    make, says = {**OUT_TARGETS, **H.BAD_NAMES}[what]
    target = make(tmp_path, "o.wav") if what in OUT_TARGETS else make(tmp_path, ".wav")
    before = H.fingerprint(target) if what in OUT_TARGETS else None
    with pytest.raises(OutputPathError, match=says):
        H.within(10, engine_audio.save_wav, target, torch.zeros(100), 24000)
    if before is not None:
        assert H.fingerprint(target) == before
    count(OUTPUT, "engine")


@pytest.mark.parametrize("what", sorted(H.BAD_NAMES) + ["folder is a file"])
def test_voice_save_names_no_file_system_holds(tmp_path, what):
    if what == "folder is a file":
        (tmp_path / "file").write_text("")
        target, says = tmp_path / "file" / "v.safetensors", "cannot create the folder"
    else:
        make, says = H.BAD_NAMES[what]
        target = make(tmp_path, ".safetensors")
    with pytest.raises(OutputPathError, match=says):
        Voice(spk_embedding=torch.randn(8), model_size="0b6").save(target)
    count(OUTPUT, "engine")


def test_voice_save_replaces_a_regular_file_whole_and_keeps_links_apart(tmp_path):
    """The control: a regular file is replaced by a complete voice; a link to a regular file is replaced by the
    voice (the file it pointed at is left as it was)."""
    voice = Voice(spk_embedding=torch.randn(8), model_size="0b6")
    (tmp_path / "v.safetensors").write_bytes(b"old")
    voice.save(tmp_path / "v.safetensors")
    assert Voice.load(tmp_path / "v.safetensors").width == 8
    (tmp_path / "elsewhere").write_bytes(b"keep")
    os.symlink(tmp_path / "elsewhere", tmp_path / "l.safetensors")
    voice.save(tmp_path / "l.safetensors")
    assert (tmp_path / "elsewhere").read_bytes() == b"keep"
    assert Voice.load(tmp_path / "l.safetensors").width == 8


# ---------------------------------------------------------------------------------------------------------
# nodes: one in-process ComfyUI with the pack loaded

@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    need(comfy_nodes.missing())
    comfy_nodes.load_pack(tmp_path_factory.mktemp("comfy_base"))
    m = comfy_nodes.pack_module
    return {"voice": m("nodes/node_voice.py"), "script": m("nodes/node_script.py"),
            "Voice": m("engine/voice.py").Voice, "cache": m("nodes/engine_cache.py")}


@pytest.fixture
def voices(pack, tmp_path, monkeypatch):
    folder = tmp_path / "voices"
    comfy = pack["voice"].comfy_paths
    monkeypatch.setattr(comfy, "voice_save_dir", lambda: str(folder))
    monkeypatch.setattr(comfy, "voice_dirs", lambda: [str(folder)])
    return folder


def _in_chain(exc: BaseException, name: str) -> BaseException | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(c.__name__ == name for c in type(exc).__mro__):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def node_refuses(fn, error: str, words: str, *args, **kwargs) -> BaseException:
    """fn refuses with a node message (starting with the node's name) and a typed `error` in its chain."""
    import re

    with pytest.raises(Exception) as info:
        H.within(10, fn, *args, **kwargs)
    assert _in_chain(info.value, error) is not None, f"not a {error}: {type(info.value).__name__}: {info.value}"
    assert not isinstance(info.value, OSError), info.value
    assert re.search(words, str(info.value)), f"/{words}/ not in: {info.value}"
    return info.value


@pytest.mark.parametrize("what", sorted(OUT_TARGETS))
def test_save_voice_node_never_replaces_a_special_file(pack, voices, what):
    voices.mkdir()
    make, says = OUT_TARGETS[what]
    target = make(voices, "mine.safetensors")
    before = H.fingerprint(target)
    err = node_refuses(pack["voice"].SaveVoice.execute, "OutputPathError", "^SaveVoice: .*" + says,
                       pack["Voice"](spk_embedding=torch.randn(8), model_size="0b6"), "mine", True)
    assert str(target) in str(err)
    assert H.fingerprint(target) == before
    count(OUTPUT, "node")


def test_save_voice_node_with_a_file_where_the_folder_goes(pack, voices):
    voices.write_text("not a folder")
    node_refuses(pack["voice"].SaveVoice.execute, "OutputPathError", "^SaveVoice: cannot use the voices folder",
                 pack["Voice"](spk_embedding=torch.randn(8), model_size="0b6"), "mine", True)
    assert voices.read_text() == "not a folder"
    count(OUTPUT, "node")


@pytest.fixture
def output_dir(tmp_path, monkeypatch):
    import folder_paths

    out = tmp_path / "output"
    out.mkdir()
    monkeypatch.setattr(folder_paths, "get_output_directory", lambda: str(out))
    return out


SRT = "1\n00:00:00,000 --> 00:00:01,000\nHello.\n"


@pytest.mark.parametrize("prefix,says", [("n" * 300, "bytes long, but file systems allow at most 255"),
                                         ("qwen3tts/" + "d" * 260 + "/subs", "bytes long"),
                                         ("../outside/subs", "points outside the output folder")])
def test_save_subtitles_path_errors_are_typed_node_messages(pack, output_dir, prefix, says):
    node_refuses(pack["script"].SaveSubtitles.execute, "OutputPathError", "^SaveSubtitles: .*" + says, SRT, prefix)
    assert list(output_dir.rglob("*.srt")) == []
    count(OUTPUT, "node")


# ---------------------------------------------------------------------------------------------------------
# class: no silent overwrite

@pytest.mark.parametrize("typed", [" keep", "keep ", "  keep  ", "\tkeep\n", "keep\r", "keep\x00", "\x1bkeep",
                                   "ke\u200bep", "keep\u202e", "\ufeffkeep"])
def test_a_cleaned_name_never_replaces_another_voice(pack, voices, typed):
    node = pack["voice"].SaveVoice
    node.execute(pack["Voice"](spk_embedding=torch.ones(8), model_size="0b6"), "keep", True)
    saved = voices / "keep.safetensors"
    before = saved.read_bytes()
    node_refuses(node.execute, "InvalidInputError", r"^SaveVoice: the name .* is saved as 'keep'.*type 'keep' "
                 r"exactly", pack["Voice"](spk_embedding=torch.zeros(8), model_size="0b6"), typed, True)
    assert saved.read_bytes() == before
    assert sorted(p.name for p in voices.iterdir()) == ["keep.safetensors"]
    count(OVERWRITE, "node")


def test_the_exact_name_with_overwrite_replaces_and_says_so(pack, voices):
    node = pack["voice"].SaveVoice
    node.execute(pack["Voice"](spk_embedding=torch.ones(8), model_size="0b6"), "keep", True)
    out = node.execute(pack["Voice"](spk_embedding=torch.zeros(8), model_size="0b6"), "keep", True)
    assert "replaced the voice 'keep'" in out.ui["text"][0]
    assert float(Voice.load(voices / "keep.safetensors").spk_embedding.abs().sum()) == 0.0
    node_refuses(node.execute, "InvalidInputError", "enable overwrite",
                 pack["Voice"](spk_embedding=torch.ones(8), model_size="0b6"), "keep", False)
    count(OVERWRITE, "node")


@pytest.mark.parametrize("prefix", ["", "/", "qwen3tts/", " \x00 ", "qwen3tts/\t/"])
def test_save_subtitles_writes_a_new_file_every_run(pack, output_dir, prefix):
    node = pack["script"].SaveSubtitles
    names = [node.execute(SRT + f"run {i}\n", prefix).ui["subtitles"][0] for i in range(3)]
    files = sorted(output_dir.rglob("*.srt"))
    assert len({(n["subfolder"], n["filename"]) for n in names}) == 3 and len(files) == 3, names
    assert sorted(f.read_text(encoding="utf-8")[-6:] for f in files) == ["run 0\n", "run 1\n", "run 2\n"]
    count(OVERWRITE, "node")


def test_save_subtitles_never_replaces_a_file_made_meanwhile(pack, output_dir, monkeypatch):
    """The numbered name is taken between ComfyUI's count and the write: refused, not replaced."""
    import folder_paths

    real = folder_paths.get_save_image_path

    def racing(prefix, out):
        folder, name, counter, sub, fn = real(prefix, out)
        Path(folder, f"{name}_{counter:05}_.srt").write_text("someone else's")
        return folder, name, counter, sub, fn

    monkeypatch.setattr(folder_paths, "get_save_image_path", racing)
    node_refuses(pack["script"].SaveSubtitles.execute, "OutputPathError", "exists .* never replaced", SRT, "x")
    assert [f.read_text() for f in output_dir.rglob("*.srt")] == ["someone else's"]
    count(OVERWRITE, "node")


# ---------------------------------------------------------------------------------------------------------
# class: size before work

def test_a_gigabyte_wav_is_refused_from_its_header(tmp_path, monkeypatch):
    path = H.sparse_wav(tmp_path / "huge.wav", 3 * H.GB)  # 3 GB of 16-bit mono at 24 kHz: 18 hours
    reads = H.ReadCounter(monkeypatch, engine_audio)
    with pytest.raises(ReferenceAudioError, match=f"{path} is 67109 s long.*trim it to at most 60 s"):
        engine_audio.load_wav(path)
    assert reads.bytes < 4096
    count(SIZE, "engine")


@pytest.mark.parametrize("declared", [0xFFFFFFFF, 2 * H.GB])
def test_an_open_or_false_data_size_reads_no_more_than_the_limit(tmp_path, monkeypatch, declared):
    """0xFFFFFFFF (streamed writers: the rest of the file) on 3 GB; 2 GB declared in a 3 GB file."""
    path = H.sparse_wav(tmp_path / "open.wav", 3 * H.GB, data_size=declared)
    reads = H.ReadCounter(monkeypatch, engine_audio)
    with pytest.raises(ReferenceAudioError, match="trim it to at most 60 s"):
        engine_audio.load_wav(path)
    assert reads.bytes < 4096
    count(SIZE, "engine")


def test_without_a_duration_limit_the_sample_limit_holds(tmp_path, monkeypatch):
    path = H.sparse_wav(tmp_path / "wide.wav", 600 << 20, channels=32, rate=192000)  # 600 MB: 49 s of 32 channels
    reads = H.ReadCounter(monkeypatch, engine_audio)
    with pytest.raises(InvalidInputError, match=r"holds 314,572,\d+ samples .* more than the 67,108,864"):
        engine_audio.load_wav(path, max_seconds=None)
    assert reads.bytes < 4096
    count(SIZE, "engine")


def test_the_duration_limit_is_exact_and_reads_only_the_data(tmp_path, monkeypatch):
    """The control: 60 s is read (in pieces, the data chunk alone), 60 s and one frame is not read at all."""
    rate = 8000
    ok = tmp_path / "60s.wav"
    ok.write_bytes(H.riff([(b"fmt ", H.fmt_chunk(rate=rate)), (b"data", H.tone_pcm16(60, rate)),
                           (b"LIST", b"x" * 5000)]))
    reads = H.ReadCounter(monkeypatch, engine_audio)
    x, sr = engine_audio.load_wav(ok)
    assert sr == rate and x.shape == (1, 60 * rate)
    assert reads.bytes == 60 * rate * 2 + 12 + 2 * 8 + 16  # header, two chunk headers, fmt, data: not LIST
    long = tmp_path / "60s_and_a_frame.wav"
    long.write_bytes(H.riff([(b"fmt ", H.fmt_chunk(rate=rate)), (b"data", H.tone_pcm16(60, rate) + b"\0\0")]))
    with pytest.raises(ReferenceAudioError, match="trim it to at most 60 s"):
        engine_audio.load_wav(long)


def test_cli_refuses_a_huge_reference_before_the_load(tiny_checkpoints, tmp_path, no_load):
    path = H.sparse_wav(tmp_path / "huge.wav", 3 * H.GB)
    rc, err = run_cli("--model", tiny_checkpoints["base"], "--mode", "clone", "--ref-audio", path,
                      "--out", tmp_path / "o.wav")
    refused(rc, err, f"{path} is 67109 s long", "trim it to at most 60 s")
    count(SIZE, "cli")


def test_a_huge_voice_file_is_refused_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.truncate(H.GB)
    import safetensors

    reads = H.ReadCounter(monkeypatch, engine_voice)
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("the file was opened"))
    with pytest.raises(VoiceError, match=r"is 1,073,741,824 bytes; a voice file is at most"):
        Voice.load(path)
    assert reads.bytes == 0
    count(SIZE, "engine")


@pytest.mark.parametrize("length", [2**40, 2**63, 10**6])
def test_a_voice_header_longer_than_its_file_is_refused(tmp_path, monkeypatch, length):
    path = tmp_path / "lies.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b'{"__metadata__": {}}')
    reads = H.ReadCounter(monkeypatch, engine_voice)
    with pytest.raises(VoiceError, match=f"header declares {length:,} bytes but the file holds 20"):
        Voice.load(path)
    assert reads.bytes == 8
    count(SIZE, "engine")


@pytest.mark.parametrize("length", [2**40, 2**63])
def test_a_checkpoint_header_longer_than_its_file_is_refused(tmp_path, length):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b"{}")
    with pytest.raises(CheckpointError, match=f"header declares {length:,} bytes"):
        ckpt_reader._header(path)
    count(SIZE, "engine")


def test_cli_refuses_a_huge_voice_before_the_load(tiny_checkpoints, tmp_path, no_load):
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.truncate(H.GB)
    rc, err = run_cli("--model", tiny_checkpoints["base"], "--mode", "clone", "--voice", path,
                      "--out", tmp_path / "o.wav")
    refused(rc, err, "a voice file is at most")
    count(SIZE, "cli")


def test_load_voice_node_refuses_a_huge_voice(pack, voices, tiny_checkpoints):
    voices.mkdir()
    with open(voices / "huge.safetensors", "wb") as f:
        f.truncate(H.GB)
    node_refuses(pack["voice"].LoadVoice.execute, "VoiceError", "^LoadVoice: .*a voice file is at most",
                 _base_ref(pack, tiny_checkpoints), "huge")
    count(SIZE, "node")


def _base_ref(pack, tiny_checkpoints):
    cache = pack["cache"]
    key = cache.EngineConfig(model_dir=os.path.realpath(tiny_checkpoints["base"]), device="cpu", dtype="fp32",
                             cuda_graphs="auto", triton="auto", max_takes=1)
    return cache.ModelRef(key=key, name="tiny-base", model_type="base")


# ---------------------------------------------------------------------------------------------------------
# class: lying files

@pytest.mark.parametrize("what", sorted(H.LYING_WAVS))
def test_a_lying_wav_header_is_refused_naming_the_file(tmp_path, what):
    data, says = H.LYING_WAVS[what]
    path = tmp_path / "lies.wav"
    path.write_bytes(data)
    with pytest.raises(InvalidInputError, match=says) as err:
        engine_audio.load_wav(path)
    assert str(path) in str(err.value)
    count(LYING, "engine")


@pytest.mark.parametrize("what", ["block align larger than channels x bits", "sample rate 0",
                                  "data size past the end of the file", "odd data size (half a frame)"])
def test_cli_refuses_a_lying_wav_before_the_load(tiny_checkpoints, tmp_path, no_load, what):
    data, says = H.LYING_WAVS[what]
    path = tmp_path / "lies.wav"
    path.write_bytes(data)
    rc, err = run_cli("--model", tiny_checkpoints["base"], "--mode", "clone", "--ref-audio", path,
                      "--out", tmp_path / "o.wav")
    refused(rc, err, str(path), says)
    count(LYING, "cli")


INPUTS = {**H.SPECIALS, "dangling link": (H.dangling_link, r"does not exist \(it is a link to a missing file\)")}


@pytest.mark.parametrize("what", sorted(INPUTS))
def test_special_files_as_input_files_say_what_they_are(tmp_path, what):
    make, says = INPUTS[what]
    wav, voice = make(tmp_path, "in.wav"), make(tmp_path, "in.safetensors")
    with pytest.raises(InvalidInputError, match=f"audio file {wav} .*{says}"):
        H.within(10, engine_audio.load_wav, wav)
    with pytest.raises(VoiceError, match=f"voice file {voice} .*{says}"):
        H.within(10, Voice.load, voice)
    count(LYING, "engine")
    count(LYING, "engine")


@pytest.mark.parametrize("option", ["--ref-audio", "--voice"])
@pytest.mark.parametrize("what", sorted(INPUTS))
def test_cli_special_input_files_say_what_they_are(tiny_checkpoints, tmp_path, no_load, option, what):
    make, says = INPUTS[what]
    path = make(tmp_path, "in.file")
    rc, err = H.within(10, run_cli, "--model", tiny_checkpoints["base"], "--mode", "clone", option, path,
                       "--out", tmp_path / "o.wav")
    refused(rc, err, f"{option} {path}", says)
    count(LYING, "cli")


@pytest.mark.parametrize("option", ["--ref-audio", "--voice", "--model", "--codec-dir"])
@pytest.mark.parametrize("what", sorted(H.BAD_NAMES))
def test_cli_input_names_no_file_system_holds(tiny_checkpoints, tmp_path, no_load, option, what):
    make, says = H.BAD_NAMES[what]
    rc, err = run_cli("--model", tiny_checkpoints["base"], "--mode", "clone", option, make(tmp_path, ".x"),
                      "--out", tmp_path / "o.wav")
    refused(rc, err, option, says)
    count(LYING, "cli")


@pytest.mark.parametrize("what", sorted(H.SPECIALS))
def test_load_voice_node_special_files_say_what_they_are(pack, voices, tiny_checkpoints, what):
    voices.mkdir()
    make, says = H.SPECIALS[what]
    make(voices, "odd.safetensors")
    node_refuses(pack["voice"].LoadVoice.execute, "InvalidInputError", "^LoadVoice: voice 'odd'.*" + says,
                 _base_ref(pack, tiny_checkpoints), "odd")
    count(LYING, "node")


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.mark.parametrize("what,rel", [("FIFO", "config.json"), ("directory", "model.safetensors"),
                                      ("link to a FIFO", "merges.txt"), ("device", "vocab.json")])
def test_special_files_in_a_checkpoint_say_what_they_are(pack, tiny_checkpoints, tmp_path, what, rel):
    """Never read (a FIFO would block, /dev/zero never ends): named as what they are, on every surface."""
    make = H.SPECIALS[what][0]
    ckpt = _copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    (ckpt / rel).unlink()
    make(ckpt, rel)
    with pytest.raises(CheckpointError, match=r"is (a directory|a FIFO|a character device).*, not a file"):
        H.within(20, Engine.load, ckpt, device="cpu", dtype="fp32")
    count(LYING, "engine")
    rc, err = H.within(20, run_cli, "--model", ckpt, "--mode", "custom", "--out", tmp_path / "o.wav")
    refused(rc, err, f"{ckpt / rel} is (a directory|a FIFO|a character device)")
    count(LYING, "cli")
    cache = pack["cache"]
    key = cache.EngineConfig(model_dir=str(ckpt), device="cpu", dtype="fp32", cuda_graphs="auto", triton="auto",
                             max_takes=1)
    node_refuses(cache.acquire, "CheckpointError", "is (a directory|a FIFO|a character device).*, not a file", key)
    count(LYING, "node")


@pytest.mark.parametrize("merges", ["", "#version: 0.2\n", "\n\n"])
def test_an_empty_merges_file_is_refused_at_load(tiny_checkpoints, tmp_path, merges):
    ckpt = _copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    (ckpt / "merges.txt").write_text(merges, encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"merges\.txt holds no merges.*Re-download merges\.txt"):
        TextTokenizer.from_dir(ckpt)
    with pytest.raises(CheckpointError, match="holds no merges"):
        Engine.load(ckpt, device="cpu", dtype="fp32")
    count(LYING, "engine")


def _nan_checkpoint(src: Path, dst: Path, everything: bool) -> Path:
    """A copy of `src` whose talker weights are all NaN (everything) or hold one NaN."""
    from safetensors.torch import load_file, save_file

    ckpt = _copy_checkpoint(src, dst)
    weights = ckpt / "model.safetensors"
    tensors = load_file(str(weights))
    for name, t in tensors.items():
        if t.is_floating_point() and name.startswith("talker."):
            if everything:
                t.fill_(float("nan"))
            elif t.dim() == 2:
                t[0, 0] = float("nan")
                break
    weights.unlink()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return ckpt


def test_all_nan_weights_are_refused_at_load(tiny_checkpoints, tmp_path):
    ckpt = _nan_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "nan", everything=True)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'talker\..*' \(and \d+ more\) holds only "
                                              r"NaN or Inf values.*download it again"):
        Engine.load(ckpt, device="cpu", dtype="fp32")
    count(LYING, "engine")


def test_one_nan_weight_loads_with_a_warning(tiny_checkpoints, tmp_path, caplog):
    ckpt = _nan_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "one_nan", everything=False)
    with caplog.at_level(logging.WARNING, logger="engine.checkpoint.finite"):
        Engine.load(ckpt, device="cpu", dtype="fp32")
    assert any("holds NaN or Inf values; the output may be noise" in r.getMessage() for r in caplog.records)
    clean = tiny_checkpoints["custom_voice"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.checkpoint.finite"):
        Engine.load(clean, device="cpu", dtype="fp32")
    assert not caplog.records  # the control: finite weights say nothing
    count(LYING, "engine")


@pytest.mark.parametrize("what", ["empty merges", "all-NaN weights"])
def test_cli_and_node_report_a_lying_checkpoint(pack, tiny_checkpoints, tmp_path, what):
    if what == "empty merges":
        ckpt = _copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
        (ckpt / "merges.txt").write_text("", encoding="utf-8")
        says = "holds no merges"
    else:
        ckpt = _nan_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt", everything=True)
        says = "holds only NaN or Inf values"
    rc, err = run_cli("--model", ckpt, "--out", tmp_path / "o.wav")
    refused(rc, err, says)
    count(LYING, "cli")
    cache = pack["cache"]
    key = cache.EngineConfig(model_dir=str(ckpt), device="cpu", dtype="fp32", cuda_graphs="auto", triton="auto",
                             max_takes=1)
    node_refuses(cache.acquire, "CheckpointError", says, key)
    assert not (tmp_path / "o.wav").exists()
    count(LYING, "node")


# ---------------------------------------------------------------------------------------------------------

def test_counts(figure):
    """Cases run per class and surface (docs/RELIABILITY.md)."""
    table = {cls: {s: COUNTS[(cls, s)] for s in ("engine", "cli", "node") if COUNTS[(cls, s)]}
             for cls in (OUTPUT, OVERWRITE, SIZE, LYING)}
    figure(cases=sum(COUNTS.values()), by_class_and_surface=table)
    assert all(table.values()), table

