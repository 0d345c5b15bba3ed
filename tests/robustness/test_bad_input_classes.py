"""Every bad-input class of tests/support/bad_inputs.py through the engine API, the CLI
(`python -m engine synth`, in process) and the ComfyUI nodes (called directly, in a real in-process ComfyUI).

Each case must end in a typed project error (engine/errors.py; for nodes anywhere in the exception chain)
whose message matches the case's hint, i.e. says what to do, or, for odd but valid input, in a normal
result. Any other exception fails the test with its traceback: that is a crash. The engines stay usable
afterwards: the last test re-runs a fixed-seed request and compares it with the run made before any case.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import Engine, Request, Voice, cli
from engine.errors import Qwen3TTSError
from tests.support import bad_inputs as B
from tests.support import comfy_nodes
from tests.support._q3support import need

MODEL_OF_MODE = {"custom": "custom_voice", "design": "voice_design", "clone": "base"}
REQUEST = {"custom": dict(text="Fine.", language="english", speaker="ryan"),
           "design": dict(text="Fine.", instruct="calm"), "clone": dict(text="Fine.")}
NODE_OF_MODE = {"custom": "CustomVoice", "design": "VoiceDesign", "clone": "VoiceClone"}
FRAMES = 2  # frames per generation: the cases are about validation, not audio
OUTCOMES: dict[tuple[str, str, str], str] = {}  # (class, variant, surface) -> typed error name | "ok"


def _cases(surface):
    return [pytest.param(c, id=f"{c.cls}|{c.variant}") for c in B.CASES if surface in c.surfaces]


@pytest.fixture(scope="module")
def ctx(tiny_checkpoints, tmp_path_factory):
    engines = {k: Engine.load(p, device="cpu", dtype="fp32") for k, p in tiny_checkpoints.items()}
    tmp = tmp_path_factory.mktemp("bad_inputs")
    voice = engines["base"].extract_voice(B.tone(), B.SR)
    e = engines["custom_voice"]
    before = e.generate(Request(mode="custom", **REQUEST["custom"]), seed=7,
                        params=e.defaults.replace(max_new_tokens=4)).codes[0]
    return {"engines": engines, "ckpts": tiny_checkpoints, "tmp": tmp, "voice": voice, "before": before,
            "good_voice": voice.save(tmp / "good.safetensors"), "good_embedding": voice.spk_embedding}


def _mode(p):
    return p.get("mode", "custom")


def _model(p):
    return p.get("model") or MODEL_OF_MODE.get(_mode(p), "custom_voice")


def _slug(case):
    return re.sub(r"[^A-Za-z0-9]+", "_", case.id).strip("_")


def _check_error(case, exc, surface):
    msg = str(exc)
    assert re.search(case.hint, msg, re.I | re.S), f"{case.id} via {surface}: message lacks /{case.hint}/: {msg}"
    OUTCOMES[(case.cls, case.variant, surface)] = type(exc).__name__


# ---------------------------------------------------------------------------------------------------------
# engine API

def run_engine(case, ctx):
    p, engines = case.payload, ctx["engines"]
    if case.kind == "reference":
        return engines["base"].extract_voice(p["wave"](), p["sr"], ref_text=p.get("ref_text"))
    mode = "clone" if case.kind == "voice" else _mode(p)
    fields = dict(REQUEST.get(mode, REQUEST["custom"]))
    fields.update({k: v for k, v in p.items() if k in ("text", "language", "speaker", "instruct")})
    voice = ctx["voice"] if mode == "clone" else None
    if case.kind == "voice":
        voice = p["voice"] if "voice" in p else None
        if voice is None:
            path = ctx["tmp"] / f"engine_{_slug(case)}.safetensors"
            p["write"](path, ctx)
            voice = Voice.load(path)
    engine = engines["base" if case.kind == "voice" else _model(p)]
    req = Request(mode=mode, voice=voice, **fields)
    changes = {k: v for k, v in p.items() if case.kind == "sampling"}
    params = engine.defaults.replace(**{"max_new_tokens": FRAMES, **changes})
    if "chunk_frames" in p:
        return list(engine.stream(req, params=params, chunk_frames=p["chunk_frames"]))
    return engine.generate(req, params=params, takes=p.get("takes", 1), seed=p.get("seed", 0),
                           first_take=p.get("first_take", 0))


@pytest.mark.parametrize("case", _cases("engine"))
def test_engine_api(ctx, case):
    if case.expect == "ok":
        out = run_engine(case, ctx)
        assert out is not None
        OUTCOMES[(case.cls, case.variant, "engine")] = "ok"
        return
    with pytest.raises(Qwen3TTSError) as err:
        run_engine(case, ctx)
    _check_error(case, err.value, "engine")


# ---------------------------------------------------------------------------------------------------------
# CLI

CLI_FLAGS = {"text": "--text", "language": "--language", "speaker": "--speaker", "instruct": "--instruct",
             "takes": "--takes", "seed": "--seed", "first_take": "--first-take", "chunk_frames": "--chunk-frames", "max_new_tokens": "--max-new-tokens",
             "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
             "repetition_penalty": "--repetition-penalty"}


def write_wav(path: Path, x, sr: int, pcm16: bool = False) -> Path:
    """[T] or [C, T] as a WAV file: IEEE float (32 or 64 bit, so NaN and Inf survive) or 16-bit PCM."""
    x = np.atleast_2d(np.asarray(x))
    if pcm16:
        data, tag, width = np.clip(np.rint(x * 32768), -32768, 32767).astype("<i2"), 1, 2
    else:
        data = x.astype("<f8" if x.dtype == np.float64 else "<f4")
        tag, width = 3, data.dtype.itemsize
    body = np.ascontiguousarray(data.T).tobytes()
    channels = x.shape[0]
    fmt = struct.pack("<HHIIHH", tag, channels, int(sr), int(sr) * channels * width, channels * width, 8 * width)
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(body)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                     + b"data" + struct.pack("<I", len(body)) + body)
    return path


def cli_argv(case, ctx) -> list[str]:
    p, tmp = case.payload, ctx["tmp"]
    argv = ["synth", "--device", "cpu", "--dtype", "fp32", "--out", str(tmp / "cli.wav")]
    if case.kind in ("reference", "voice"):
        argv += ["--model", str(ctx["ckpts"]["base"]), "--mode", "clone"]
        if case.kind == "reference":
            wav = write_wav(tmp / f"{_slug(case)}.wav", p["wave"](), p["sr"], p.get("pcm16", False))
            argv += ["--ref-audio", str(wav), "--xvec-only"]
        else:
            path = tmp / f"cli_{_slug(case)}.safetensors"
            p["write"](path, ctx)
            argv += ["--voice", str(path)]
    else:
        argv += ["--model", str(ctx["ckpts"][_model(p)]), "--mode", _mode(p)]
    if "chunk_frames" in p:
        argv.append("--stream")
    values = {"max_new_tokens": FRAMES, **{k: v for k, v in p.items() if k in CLI_FLAGS}}
    for name, value in values.items():
        argv += [CLI_FLAGS[name], str(value)]
    return argv


def run_cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse refusing a value (e.g. --takes nan): usage and exit 2
            rc = exc.code
    return rc, err.getvalue()


@pytest.mark.parametrize("case", _cases("cli"))
def test_cli(ctx, case):
    rc, err = run_cli(cli_argv(case, ctx))
    assert "Traceback" not in err, err
    if case.expect == "ok":
        assert rc == 0, err
        OUTCOMES[(case.cls, case.variant, "cli")] = "ok"
        return
    assert rc == 2, f"exit {rc}: {err}"
    if "error: argument" in err:  # argparse: the flag's type refused the value before the engine saw it
        assert "invalid" in err, err
        OUTCOMES[(case.cls, case.variant, "cli")] = "argparse"
        return
    assert err.startswith("error: ") or "\nerror: " in err, err
    _check_error(case, RuntimeError(err), "cli")
    OUTCOMES[(case.cls, case.variant, "cli")] = "error (exit 2)"


# ---------------------------------------------------------------------------------------------------------
# nodes

@pytest.fixture(scope="module")
def nodes(ctx, tmp_path_factory):
    need(comfy_nodes.missing())
    comfy_nodes.load_pack(tmp_path_factory.mktemp("comfy_base"))
    m = comfy_nodes.pack_module
    cache, gen, voice_nodes = m("nodes/engine_cache.py"), m("nodes/node_generate.py"), m("nodes/node_voice.py")
    stream = m("nodes/node_stream.py").StreamChunks.PREPARE_CLASS_CLONE({})
    refs = {}
    for kind, path in ctx["ckpts"].items():
        key = cache.EngineConfig(model_dir=os.path.realpath(path), device="cpu", dtype="fp32", cuda_graphs="auto",
                              triton="auto", max_takes=4)
        refs[kind] = cache.ModelRef(key=key, name=f"tiny-{kind}", model_type=kind)
    pack_voice = m("engine/voice.py").Voice.load(ctx["good_voice"])
    import folder_paths

    own = tmp_path_factory.mktemp("qwen3_tts")  # bad voice files go here, never into a real models folder
    folder_paths.add_model_folder_path("qwen3_tts", str(own))
    voices = own / "voices"
    voices.mkdir()
    yield {"refs": refs, "CustomVoice": gen.CustomVoice, "VoiceDesign": gen.VoiceDesign, "VoiceClone": gen.VoiceClone,
            "StreamChunks": stream, "Extract": voice_nodes.ExtractSpeakerEmbedding, "LoadVoice": voice_nodes.LoadVoice,
            "voice": pack_voice, "voices": voices}
    folder_paths.folder_names_and_paths["qwen3_tts"][0].remove(str(own))


def _node_waveform(p):
    x = p["wave"]()
    if p.get("node_waveform") or not isinstance(x, np.ndarray):
        return torch.as_tensor(x) if isinstance(x, np.ndarray) else x
    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t[None] if t.dim() == 1 else t)[None]  # [1, C, T]


def run_node(case, ctx, n):
    p, refs = case.payload, n["refs"]
    if case.kind == "reference":
        audio = {"waveform": _node_waveform(p), "sample_rate": p["sr"]}
        return n["Extract"].execute(model=refs["base"], audio=audio, batch_index=0, ref_text=p.get("ref_text", ""))
    if case.kind == "voice" and "write" in p:
        name = _slug(case)
        p["write"](n["voices"] / f"{name}.safetensors", ctx)
        return n["LoadVoice"].execute(model=refs["base"], voice_name=name)
    mode = "clone" if case.kind == "voice" else _mode(p)
    fields = dict(REQUEST[mode])
    fields.update({k: v for k, v in p.items() if k in ("text", "language", "speaker", "instruct")})
    fields.setdefault("language", "Auto")
    widgets = {"max_new_tokens": FRAMES, **{k: v for k, v in p.items() if case.kind == "sampling"}}
    call = dict(model=refs[p.get("model") or MODEL_OF_MODE[mode]], text=fields["text"], language=fields["language"], seed=p.get("seed", 0),
                **widgets)
    if "chunk_frames" in p:
        return n["StreamChunks"].execute(chunk_frames=p["chunk_frames"], speaker="Ryan", **call)
    call.update(takes=p.get("takes", 1), first_take=p.get("first_take", 0))
    if mode == "custom":
        return n["CustomVoice"].execute(speaker=fields.get("speaker", "Ryan"), instruct="", **call)
    if mode == "design":
        return n["VoiceDesign"].execute(instruct=fields["instruct"], **call)
    return n["VoiceClone"].execute(voice=p.get("voice", n["voice"]), **call)


@pytest.mark.parametrize("case", _cases("node"))
def test_nodes(ctx, nodes, case, monkeypatch):
    import server

    monkeypatch.setattr(server.PromptServer, "instance", None)  # no client to stream to (a test may leave a dead one)
    if case.expect == "ok":
        assert run_node(case, ctx, nodes) is not None
        OUTCOMES[(case.cls, case.variant, "node")] = "ok"
        return
    with pytest.raises(Exception) as err:
        run_node(case, ctx, nodes)
    typed = B.project_error(err.value)
    assert typed is not None, f"{case.id}: untyped {type(err.value).__name__}: {err.value}"
    _check_error(case, err.value, "node")
    OUTCOMES[(case.cls, case.variant, "node")] = type(typed).__name__


def test_node_splits_100k_text(ctx, nodes):
    """100k characters are valid node input: the runner splits them into cache-sized segments (checked without
    generating them all: the split happens before the engine runs)."""
    runner = comfy_nodes.pack_module("nodes/runner.py")
    job = runner.Job("CustomVoice", nodes["refs"]["custom_voice"], "custom", "word " * 20000, "Auto", speaker="Ryan",
                     max_segment_chars=5000, max_new_tokens=FRAMES)
    assert len(job.segments) > 1 and "".join(job.segments).replace(" ", "") == "word" * 20000
    assert job.request(len(job.segments) - 1).text == job.segments[-1]
    OUTCOMES[("text: 100k characters", "100k", "node")] = f"ok ({len(job.segments)} segments)"


# ---------------------------------------------------------------------------------------------------------

def test_engines_unharmed_and_summary(ctx, figure):
    """After every case the engines still give the same fixed-seed output as before them."""
    e = ctx["engines"]["custom_voice"]
    after = e.generate(Request(mode="custom", **REQUEST["custom"]), seed=7,
                       params=e.defaults.replace(max_new_tokens=4)).codes[0]
    assert torch.equal(after, ctx["before"])
    ran = {(c, v) for c, v, _ in OUTCOMES}
    by_surface = {s: sum(1 for k in OUTCOMES if k[2] == s) for s in ("engine", "cli", "node")}
    errors = sum(1 for v in OUTCOMES.values() if not v.startswith("ok"))
    figure(classes=len({c for c, _ in ran}), cases=len(ran), runs=len(OUTCOMES), runs_by_surface=by_surface,
           typed_errors=errors, accepted=len(OUTCOMES) - errors, classes_defined=len(B.classes()))
    if os.environ.get("QWEN3TTS_BAD_INPUT_TABLE"):  # writes the table docs/RELIABILITY.md quotes
        Path(os.environ["QWEN3TTS_BAD_INPUT_TABLE"]).write_text(_table())


def _table() -> str:
    lines = ["| class | case | engine API | CLI | nodes |", "|---|---|---|---|---|"]
    for c in B.CASES:
        cells = [OUTCOMES.get((c.cls, c.variant, s), "–") for s in ("engine", "cli", "node")]
        lines.append(f"| {c.cls} | {c.variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
