"""Load arguments and callbacks: every EngineConfig field (max_takes, warm_takes, max_seq_len, the model and codec
folders, device, dtype, the switches) and the callbacks of generate/stream (on_progress, should_stop) are checked
before any work, with a typed error naming the argument; through the engine API, the CLI (exit 2, one `error:`
line) and the loader node. A callback that raises ends the call with its own exception, noted as the callback's,
and leaves the engine free and exact: the next call gives the same fixed-seed codes.
"""
from __future__ import annotations

import contextlib
import io
import os

import pytest

from engine import Engine, Request, cli
from engine.errors import Qwen3TTSError, UnsupportedConfigError
from tests.support import comfy_nodes
from tests.support._q3support import need

REQUEST = Request(mode="custom", text="Fine.", language="english", speaker="ryan")
FRAMES = 3


def _folders(tmp_path, ckpt) -> dict:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    return {"missing": str(tmp_path / "nope"), "a_file": str(tmp_path / "a_file"),
            "not_a_checkpoint": str(tmp_path / "empty"), "empty_string": "", "nul": str(ckpt) + "\0x",
            "a_number": 5, "none": None, "a_list": [str(ckpt)]}


# field -> bad values (each must be refused before any weights are read)
BAD_SETTINGS = {
    "max_takes": [0, -1, 65, 2.5, "4", None, True, float("nan")],
    "warm_takes": [0, 5, "1", None],  # 5 > max_takes 4
    "max_seq_len": [0, 15, (1 << 16) + 1, 4096.0, "4096", None, False, float("inf")],
    "device": ["gpu", "cuda:x", "", None, 0, "cpu:0", "cuda:99", "mps"],
    "dtype": ["float32", "int8", "", None, 16],
    "cuda_graphs": ["yes", True, None, ""],
    "triton": ["no", False, None],
    "batch_invariant": ["yes", 1, None],
}
COUNTS: dict[str, int] = {}


def _count(surface: str) -> None:
    COUNTS[surface] = COUNTS.get(surface, 0) + 1


@pytest.fixture
def no_work(monkeypatch):
    """Any checkpoint read fails the test: the arguments must be refused before it."""
    from engine.checkpoint import loader

    def read(*_a, **_k):
        raise AssertionError("the load started reading the checkpoint before refusing its arguments")

    monkeypatch.setattr(loader, "read_configs", read)


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in BAD_SETTINGS.items() for v in vs])
def test_engine_refuses_bad_load_settings_before_any_work(tiny_checkpoints, no_work, field, value):
    options = {"device": "cpu", "max_takes": 4, field: value}
    with pytest.raises(Qwen3TTSError, match=field):
        Engine.load(tiny_checkpoints["custom_voice"], **options)
    _count("engine settings")


def test_batch_invariance_without_the_triton_kernels_is_refused_before_any_work(tiny_checkpoints, no_work):
    """Only the Triton kernels plan their launches alike for every row count: without them the load says so."""
    with pytest.raises(UnsupportedConfigError, match="batch_invariant needs the Triton kernels.*triton auto or on"):
        Engine.load(tiny_checkpoints["custom_voice"], device="cpu", batch_invariant=True)
    _count("engine settings")


FOLDER_CASES = ["missing", "a_file", "not_a_checkpoint", "empty_string", "nul", "a_number", "none", "a_list"]


# An empty codec_dir ("" or None) means the checkpoint's own codec: not a bad value.
@pytest.mark.parametrize("field,which", [("model_dir", w) for w in FOLDER_CASES] +
                         [("codec_dir", w) for w in FOLDER_CASES if w not in ("empty_string", "none")])
def test_engine_refuses_bad_folders(tiny_checkpoints, tmp_path, field, which):
    path = _folders(tmp_path, tiny_checkpoints["custom_voice"])[which]
    options = {"device": "cpu"}
    model = tiny_checkpoints["custom_voice"] if field == "codec_dir" else path
    if field == "codec_dir":
        options["codec_dir"] = path
    with pytest.raises(Qwen3TTSError) as err:
        Engine.load(model, **options)
    if which not in ("a_number", "none", "a_list", "empty_string", "nul"):
        assert os.path.basename(str(path)) in str(err.value)
    _count("engine folders")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any folder")
def test_engine_refuses_an_unreadable_folder(tiny_checkpoints, tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0)
    try:
        with pytest.raises(Qwen3TTSError, match="not readable"):
            Engine.load(d, device="cpu")
    finally:
        d.chmod(0o700)


def test_engine_refuses_unknown_options(tiny_checkpoints, no_work):
    with pytest.raises(Qwen3TTSError, match="max_take"):
        Engine.load(tiny_checkpoints["custom_voice"], max_take=2)
    with pytest.raises(Qwen3TTSError, match="model_dir"):
        Engine.load(tiny_checkpoints["custom_voice"], model_dir="elsewhere")
    _count("engine settings")


# ---------------------------------------------------------------------------------------------------------
# callbacks

@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_takes=2)


def _codes(engine, **kw):
    return engine.generate(REQUEST, seed=11, params=engine.defaults.capped(FRAMES), chunk_frames=1, **kw).codes[0]


@pytest.fixture(scope="module")
def reference(engine):
    return _codes(engine)


NOT_CALLABLE = [5, "stop", True, [print], object()]


@pytest.mark.parametrize("name", ["on_progress", "should_stop"])
@pytest.mark.parametrize("value", NOT_CALLABLE, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("call", ["generate", "stream"])
def test_callbacks_that_are_not_callable_are_refused(engine, name, value, call):
    with pytest.raises(Qwen3TTSError, match=name):
        if call == "generate":
            engine.generate(REQUEST, params=engine.defaults.capped(FRAMES), **{name: value})
        else:
            next(engine.stream(REQUEST, params=engine.defaults.capped(FRAMES), **{name: value}))
    assert not engine._lock.busy
    _count("callbacks")


class Boom(Exception):
    pass


def _raises(*_args):
    raise Boom("the caller's own failure")


@pytest.mark.parametrize("name", ["on_progress", "should_stop"])
@pytest.mark.parametrize("call", ["generate", "stream"])
def test_a_raising_callback_leaves_the_engine_free_and_exact(engine, reference, name, call):
    with pytest.raises(Boom) as err:
        if call == "generate":
            _codes(engine, **{name: _raises})
        else:
            for _ in engine.stream(REQUEST, seed=11, params=engine.defaults.capped(FRAMES), chunk_frames=1,
                                   **{name: _raises}):
                pass
    notes = " ".join(getattr(err.value, "__notes__", []))
    assert name in notes and "ready for the next call" in notes
    assert not engine._lock.busy
    assert _codes(engine).equal(reference), "the call after a failed callback gives the same fixed-seed codes"
    _count("callbacks")


def test_a_callback_that_returns_nonsense_is_its_own_error(engine, reference):
    import numpy as np

    with pytest.raises(ValueError) as err:  # an array's truth value is ambiguous: numpy says so
        _codes(engine, should_stop=lambda: np.array([True, False]))
    assert "should_stop" in " ".join(getattr(err.value, "__notes__", []))
    assert _codes(engine).equal(reference)
    _count("callbacks")


# ---------------------------------------------------------------------------------------------------------
# CLI

def _cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(["synth", *argv])
        except SystemExit as exc:  # argparse refusing a value: usage and exit 2
            rc = exc.code
    return rc, err.getvalue()


CLI_CASES = {
    "--device gpu": ["--device", "gpu"], "--device empty": ["--device", ""], "--device cuda:x": ["--device", "cuda:x"],
    "--dtype int8": ["--dtype", "int8"], "--dtype float32": ["--dtype", "float32"],
    "--cuda-graphs yes": ["--cuda-graphs", "yes"], "--takes 17": ["--takes", "17"], "--takes 0": ["--takes", "0"],
}


@pytest.mark.parametrize("case", list(CLI_CASES) + ["--model missing", "--model a_file", "--model not_a_checkpoint",
                                                    "--codec-dir missing", "--codec-dir not_a_checkpoint"])
def test_cli_refuses_bad_load_arguments(tiny_checkpoints, tmp_path, case):
    folders = _folders(tmp_path, tiny_checkpoints["custom_voice"])
    argv = ["--out", str(tmp_path / "out.wav"), "--max-new-tokens", "2"]
    if case in CLI_CASES:
        argv += ["--model", str(tiny_checkpoints["custom_voice"]), *CLI_CASES[case]]
    else:
        option, which = case.split()
        argv += [option, folders[which]]
        if option == "--codec-dir":
            argv += ["--model", str(tiny_checkpoints["custom_voice"])]
    rc, err = _cli(argv)
    assert rc == 2 and "Traceback" not in err, err
    assert err.count("error:") == 1, err
    named = case.split()[0] if case in CLI_CASES else os.path.basename(folders[case.split()[1]])
    assert named in err or "invalid choice" in err, err
    assert not (tmp_path / "out.wav").exists()
    _count("cli")


# ---------------------------------------------------------------------------------------------------------
# nodes

@pytest.fixture(scope="module")
def loader_node(tmp_path_factory):
    need(comfy_nodes.missing())
    comfy_nodes.load_pack(tmp_path_factory.mktemp("comfy_base"))
    return comfy_nodes.pack_module("nodes/node_loader.py").LoadQwen3TTS


@pytest.mark.parametrize("widgets", [{"max_takes": 0}, {"max_takes": 17}, {"max_takes": -3},
                                     {"dtype": "int8"}, {"cuda_graphs": "yes"}, {"triton": None}],
                         ids=lambda w: "-".join(f"{k}={v}" for k, v in w.items()))
def test_loader_node_refuses_bad_settings_with_a_typed_error(tiny_checkpoints, loader_node, widgets, monkeypatch):
    import folder_paths

    root = str(tiny_checkpoints["custom_voice"].parent)
    folder_paths.add_model_folder_path("qwen3_tts", root)
    try:
        call = {"checkpoint": "custom_voice", "dtype": "fp32", "cuda_graphs": "off", "triton": "off", "max_takes": 1,
                **widgets}
        with pytest.raises(Exception) as err:
            loader_node.execute(**call)
    finally:
        folder_paths.folder_names_and_paths["qwen3_tts"][0].remove(root)
    exc, typed = err.value, None
    while exc is not None and typed is None:
        typed = exc if any(c.__name__ == "Qwen3TTSError" for c in type(exc).__mro__) else None
        exc = exc.__cause__ or exc.__context__
    assert typed is not None, repr(err.value)
    assert next(iter(widgets)) in str(err.value)
    _count("nodes")


def test_zz_counts(figure):
    """The figures of this file, per surface (run last: pytest keeps file order)."""
    figure(load_arguments_and_callbacks=dict(sorted(COUNTS.items())))
    assert COUNTS
