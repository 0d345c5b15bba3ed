"""Long text, script totals and degenerate numbers through the engine API, the CLI (in process) and the nodes
(in an in-process ComfyUI):

* a long split is interruptible (the nodes' text and every script line), before the engine is reached;
* a script's pauses and line gaps are capped in total, and a NaN, infinite or malformed gap or pause is
  refused naming the input;
* a voice blend whose weights vanish (all zero, tiny, NaN, infinite, negative summing to about 0) is refused,
  never a NaN voice, and no voice with a non-finite embedding is ever written (Voice.save, SaveVoice);
* reference codes of any small integer type within the codebook are accepted, end to end;
* a reference text of invisible characters only is refused as the same text is refused as input text.

Every refusal is a typed project error (for nodes anywhere in the chain) naming the input; the CLI exits 2
with one `error:` line and no traceback.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine import Engine, Request, Voice, blend_voices, cli
from engine.errors import InvalidInputError, VoiceError
from tests.support import comfy_nodes
from tests.support._q3support import need
from tests.support.bad_inputs import project_error

OUTCOMES: dict[tuple[str, str], int] = {}  # (class, surface) -> cases run
INVISIBLE = {"zero-width space": "\u200b\u200b", "direction marks": "\u200e\u200f", "byte-order mark": "\ufeff",
             "controls": "\x01\x02\x7f", "joiners and blanks": " \u200d \u2060 ", "soft hyphen": "\u00ad"}
VANISHING = {"all zero": [0.0, 0.0], "tiny": [1e-30, 1e-30], "denormal": [5e-324, 5e-324],
             "negative summing to 0": [1.0, -1.0], "negative tiny": [1e-9, -1e-9], "NaN": [math.nan, 1.0],
             "both NaN": [math.nan, math.nan], "inf": [math.inf, 1.0], "inf and -inf": [math.inf, -math.inf],
             "not a number": ["1", 1.0]}
CODE_DTYPES = [torch.int16, torch.int32, torch.uint8, torch.int8, torch.int64]


def _count(cls: str, surface: str, n: int = 1) -> None:
    OUTCOMES[(cls, surface)] = OUTCOMES.get((cls, surface), 0) + n


def _refused(fn, words: str):
    with pytest.raises(Exception) as err:
        fn()
    assert project_error(err.value) is not None, f"untyped {type(err.value).__name__}: {err.value}"
    assert re.search(words, str(err.value), re.IGNORECASE | re.DOTALL), str(err.value)
    return err.value


def _run_cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, err.getvalue()


def _tone(seconds=2.0, sr=24000) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(2 * np.pi * t)) * t)).astype(np.float32)


def _write_voice(path, voice: Voice, codes: torch.Tensor | None = None, ref_text: str | None = None,
                 embedding: torch.Tensor | None = None):
    """A voice file as Voice.save writes it, but with the codes' own dtype, any reference text and any
    embedding (Voice.save itself refuses what check_contents refuses)."""
    emb = (voice.spk_embedding if embedding is None else embedding).contiguous()
    tensors = {"spk_embedding": emb}
    meta = {"format": "qwen3tts-fast-voice", "version": "1", "family": voice.family, "model_size": voice.model_size,
            "width": str(emb.shape[0]), "dtype": str(emb.dtype).replace("torch.", "")}
    if codes is not None:
        tensors["ref_codes"] = codes.contiguous()
        meta["ref_text"] = json.dumps(ref_text if ref_text is not None else voice.ref_text or "words")
    save_file(tensors, str(path), metadata=meta)
    return path


@pytest.fixture(scope="module")
def ctx(tiny_checkpoints, tmp_path_factory):
    engines = {k: Engine.load(tiny_checkpoints[k], device="cpu", dtype="fp32") for k in ("base", "custom_voice")}
    icl = engines["base"].extract_voice(_tone(3.0), 24000, ref_text="Some reference words.")
    xvec = engines["base"].extract_voice(_tone(2.0, 16000), 16000)
    tmp = tmp_path_factory.mktemp("text_and_numbers")
    return {"engines": engines, "ckpts": tiny_checkpoints, "icl": icl, "xvec": xvec, "tmp": tmp}


@pytest.fixture(scope="module")
def nodes(ctx, tmp_path_factory):
    need(comfy_nodes.missing())
    comfy_nodes.load_pack(tmp_path_factory.mktemp("comfy_base"))
    m = comfy_nodes.pack_module
    cache = m("nodes/engine_cache.py")
    refs = {}
    for kind in ("base", "custom_voice"):
        key = cache.EngineConfig(model_dir=os.path.realpath(ctx["ckpts"][kind]), device="cpu", dtype="fp32",
                                 cuda_graphs="auto", triton="auto", max_takes=4)
        refs[kind] = cache.ModelRef(key=key, name=f"tiny-{kind}", model_type=kind)
    import folder_paths

    own = tmp_path_factory.mktemp("qwen3_tts")
    folder_paths.add_model_folder_path("qwen3_tts", str(own))
    (own / "voices").mkdir()
    pack_voice = m("engine/voice.py").Voice
    yield {"m": m, "refs": refs, "voices": own / "voices", "Voice": pack_voice,
           "icl": pack_voice(**{k: getattr(ctx["icl"], k) for k in ("spk_embedding", "model_size", "family",
                                                                     "ref_codes", "ref_text")}),
           "xvec": pack_voice(spk_embedding=ctx["xvec"].spk_embedding, model_size=ctx["xvec"].model_size)}
    folder_paths.folder_names_and_paths["qwen3_tts"][0].remove(str(own))


# ---------------------------------------------------------------------------------------------------------
# class 5: long text is interruptible; script silence is capped in total

@pytest.fixture
def interrupted(nodes):
    """ComfyUI's interrupt flag set, and the engine cache made to fail if anything reaches it."""
    import comfy.model_management as mm

    cache = nodes["m"]("nodes/engine_cache.py")
    real = cache.acquire

    def reached(key):
        raise AssertionError("the engine was reached: the split did not check the interrupt")
    cache.acquire = reached
    mm.interrupt_current_processing(True)
    try:
        yield mm
    finally:
        mm.interrupt_current_processing(False)
        cache.acquire = real


@pytest.mark.parametrize("text", ["x" * 400_000, "One sentence. " * 40_000, "語" * 200_000],
                         ids=["no break", "sentences", "cjk"])
def test_node_split_of_long_text_is_interruptible(nodes, interrupted, text):
    runner = nodes["m"]("nodes/runner.py")
    with pytest.raises(interrupted.InterruptProcessingException):
        runner.Job("CustomVoice", nodes["refs"]["custom_voice"], "custom", text, "Auto", speaker="Ryan")
    _count("5 long split interruptible", "node")


def test_script_split_of_a_long_line_is_interruptible(nodes, interrupted):
    script = nodes["m"]("nodes/node_script.py").Script
    with pytest.raises(interrupted.InterruptProcessingException):
        script.execute(model=nodes["refs"]["custom_voice"], script="Alice: " + "y" * 400_000, voices="Alice = Ryan",
                       language="Auto", seed=0, line_gap=0.3, names_in_subtitles=True)
    _count("5 long split interruptible", "node")


def _script(nodes, script, line_gap=0.3):
    return nodes["m"]("nodes/node_script.py").Script.execute(
        model=nodes["refs"]["custom_voice"], script=script, voices="Alice = Ryan", language="Auto", seed=0,
        line_gap=line_gap, names_in_subtitles=True, max_new_tokens=2)


@pytest.mark.parametrize("script, line_gap, words", [
    ("\n".join(["Alice: hi", "[pause 600s]"] * 2 + ["Alice: bye", "[pause 1s]"]), 0.3, r"pause.*at most 20 minutes"),
    ("\n".join(["Alice: hi"] * 200), 10.0, r"line_gap \(10 s\).*at most 20 minutes"),
    ("\n".join(["Alice: hi", "[pause 599s]"] * 3 + ["Alice: bye"]), 0.0, r"1797 s of silence"),
], ids=["pauses", "line gaps", "pauses at the single cap"])
def test_script_total_silence_is_capped_before_any_work(nodes, monkeypatch, script, line_gap, words):
    cache = nodes["m"]("nodes/engine_cache.py")
    monkeypatch.setattr(cache, "acquire", lambda key: pytest.fail("the engine was reached"))
    _refused(lambda: _script(nodes, script, line_gap), r"Script: .*" + words)
    _count("5 script total silence", "node")


def test_script_total_silence_at_the_cap_is_accepted(nodes):
    out = _script(nodes, "\n".join(["Alice: hi", "[pause 600s]"] * 2 + ["Alice: bye"]), 0.3)
    assert out.result[0]["waveform"].shape[-1] >= 1_200 * 24000
    _count("5 script total silence", "node")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.01, 10.01, "0.3", None, True],
                         ids=["nan", "inf", "-inf", "below", "above", "str", "none", "bool"])
def test_script_line_gap_that_is_not_a_number_in_range_is_named(nodes, value):
    _refused(lambda: _script(nodes, "Alice: hi\nAlice: bye", value), r"Script: line_gap must be .*number")
    _count("6 NaN line gap / pause", "node")


@pytest.mark.parametrize("tag", ["[pause nans]", "[pause infs]", "[pause -1s]", "[pause 1e999s]", "[pause 0s]",
                                 "[pause 600001ms]", "[pause 99999999999999999999999999s]"])
def test_script_pause_that_is_not_a_number_in_range_is_named(nodes, tag):
    _refused(lambda: _script(nodes, f"Alice: hi\n{tag}\nAlice: bye"), r"script line 2: .*pause")
    _count("6 NaN line gap / pause", "node")


# ---------------------------------------------------------------------------------------------------------
# class 7: vanishing blend weights, non-finite voices at save, small-int codes, invisible reference text

@pytest.mark.parametrize("weights", list(VANISHING.values()), ids=list(VANISHING))
def test_blend_with_vanishing_weights_is_refused_engine(ctx, weights):
    with pytest.raises(InvalidInputError, match=r"weight"):
        blend_voices([ctx["icl"], ctx["xvec"]], weights)
    _count("7 vanishing blend weights", "engine")


@pytest.mark.parametrize("weights", [w for k, w in VANISHING.items() if k != "not a number"],
                         ids=[k for k in VANISHING if k != "not a number"])
def test_blend_with_vanishing_weights_is_refused_node(nodes, weights):
    blend = nodes["m"]("nodes/node_blend.py").BlendVoices
    _refused(lambda: blend.execute(voice_1=nodes["icl"], voice_2=nodes["xvec"], weight_1=weights[0],
                                   weight_2=weights[1]), r"BlendVoices: .*weight")
    _count("7 vanishing blend weights", "node")


@pytest.mark.parametrize("weights", [[0.0005, 0.0005], [1e308, 1e308], [1e308, 1.0], [0.0, 0.001]])
def test_blend_of_extreme_valid_weights_is_finite(ctx, weights):
    out = blend_voices([ctx["icl"], ctx["xvec"]], weights)
    assert torch.isfinite(out.spk_embedding).all()
    _count("7 vanishing blend weights", "engine")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_voice_is_never_written(ctx, nodes, tmp_path, bad):
    emb = ctx["xvec"].spk_embedding.clone()
    emb[3] = bad
    with pytest.raises(VoiceError, match=r"NaN or Inf"):
        Voice(spk_embedding=emb, model_size=ctx["xvec"].model_size).save(tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    _count("7 non-finite voice at save", "engine")
    save = nodes["m"]("nodes/node_voice.py").SaveVoice
    name = f"nonfinite_{str(bad).replace('-', 'minus')}"
    _refused(lambda: save.execute(voice=nodes["Voice"](spk_embedding=emb, model_size=ctx["xvec"].model_size),
                                  name=name, overwrite=True), r"NaN or Inf")
    assert not any(p.name.startswith(name) or p.name.startswith(f".{name}") for p in nodes["voices"].iterdir())
    _count("7 non-finite voice at save", "node")


def _codes(ctx, dtype) -> torch.Tensor:
    codes = ctx["icl"].ref_codes
    return (codes % min(torch.iinfo(dtype).max + 1, 2048)).to(dtype)  # every value fits the type and the codebook


@pytest.mark.parametrize("dtype", CODE_DTYPES, ids=[str(d).replace("torch.", "") for d in CODE_DTYPES])
def test_small_integer_codes_are_accepted_engine(ctx, dtype, tmp_path):
    e, icl = ctx["engines"]["base"], ctx["icl"]
    codes = _codes(ctx, dtype)
    voice = Voice(spk_embedding=icl.spk_embedding, model_size=icl.model_size, ref_codes=codes, ref_text=icl.ref_text)
    params = e.defaults.replace(max_new_tokens=2)
    a = e.generate(Request(mode="clone", text="Hi.", voice=voice), params=params, seed=1).codes[0]
    b = e.generate(Request(mode="clone", text="Hi.", voice=Voice(
        spk_embedding=icl.spk_embedding, model_size=icl.model_size, ref_codes=codes.long(), ref_text=icl.ref_text)),
        params=params, seed=1).codes[0]
    assert torch.equal(a, b)  # the type changes nothing
    loaded = Voice.load(_write_voice(tmp_path / "v.safetensors", icl, codes))
    assert torch.equal(loaded.ref_codes, codes.long())
    e.check_voice(loaded)
    _count("7 small-int reference codes", "engine")


@pytest.mark.parametrize("dtype", CODE_DTYPES, ids=[str(d).replace("torch.", "") for d in CODE_DTYPES])
def test_small_integer_codes_are_accepted_cli(ctx, dtype):
    path = _write_voice(ctx["tmp"] / f"cli_{dtype}.safetensors", ctx["icl"], _codes(ctx, dtype))
    rc, err = _run_cli(["synth", "--device", "cpu", "--dtype", "fp32", "--model", str(ctx["ckpts"]["base"]),
                        "--mode", "clone", "--voice", str(path), "--max-new-tokens", "2",
                        "--out", str(ctx["tmp"] / "cli.wav")])
    assert rc == 0, err
    _count("7 small-int reference codes", "cli")


@pytest.mark.parametrize("dtype", CODE_DTYPES, ids=[str(d).replace("torch.", "") for d in CODE_DTYPES])
def test_small_integer_codes_are_accepted_node(ctx, nodes, dtype):
    name = f"codes_{str(dtype).replace('torch.', '')}"
    _write_voice(nodes["voices"] / f"{name}.safetensors", ctx["icl"], _codes(ctx, dtype))
    m = nodes["m"]
    voice = m("nodes/node_voice.py").LoadVoice.execute(model=nodes["refs"]["base"], voice_name=name).result[0]
    out = m("nodes/node_generate.py").VoiceClone.execute(model=nodes["refs"]["base"], voice=voice, text="Hi.",
                                                         language="Auto", seed=0, takes=1, max_new_tokens=2)
    assert out.result[0]["waveform"].numel() > 0
    _count("7 small-int reference codes", "node")


def test_codes_outside_the_codebook_are_still_refused_in_any_type(ctx):
    icl = ctx["icl"]
    for codes in (torch.full((4, 16), -1, dtype=torch.int8), torch.full((4, 16), 2048, dtype=torch.int16),
                  torch.full((4, 16), 70000, dtype=torch.int32)):
        with pytest.raises(VoiceError, match="outside the codebook"):
            ctx["engines"]["base"].check_voice(Voice(spk_embedding=icl.spk_embedding, model_size=icl.model_size,
                                                     ref_codes=codes, ref_text="words"))
    _count("7 small-int reference codes", "engine", 3)


EMPTY = r"is empty \(nothing but blanks, control or invisible characters\)"


@pytest.mark.parametrize("text", list(INVISIBLE.values()), ids=list(INVISIBLE))
def test_invisible_reference_text_is_refused_as_input_text_is_engine(ctx, text):
    e = ctx["engines"]
    with pytest.raises(InvalidInputError, match="the text " + EMPTY):
        e["custom_voice"].generate(Request(mode="custom", text=text, speaker="ryan"),
                                   params=e["custom_voice"].defaults.replace(max_new_tokens=2))
    with pytest.raises(InvalidInputError, match="the ref_text " + EMPTY + ".*x-vector"):
        e["base"].extract_voice(_tone(), 24000, ref_text=text)
    icl = ctx["icl"]
    with pytest.raises(VoiceError, match="no reference text"):
        Voice(spk_embedding=icl.spk_embedding, model_size=icl.model_size, ref_codes=icl.ref_codes,
              ref_text=text).check_contents()
    _count("7 invisible reference text", "engine", 3)


@pytest.mark.parametrize("text", list(INVISIBLE.values()), ids=list(INVISIBLE))
def test_invisible_reference_text_is_refused_as_input_text_is_cli(ctx, text):
    if "\x00" in text:
        pytest.skip("argv cannot carry NUL")
    base = ["synth", "--device", "cpu", "--dtype", "fp32", "--max-new-tokens", "2", "--out", str(ctx["tmp"] / "i.wav")]
    for argv, words in ((["--model", str(ctx["ckpts"]["custom_voice"]), "--text", text], "the text " + EMPTY),
                        (["--model", str(ctx["ckpts"]["base"]), "--mode", "clone", "--ref-text", text],
                         "the ref_text " + EMPTY),
                        (["--model", str(ctx["ckpts"]["base"]), "--mode", "clone", "--voice",
                          str(_write_voice(ctx["tmp"] / "inv.safetensors", ctx["icl"], ctx["icl"].ref_codes,
                                           ref_text=text))], "no reference text")):
        rc, err = _run_cli(base + argv)
        assert rc == 2 and "Traceback" not in err, err
        assert re.search("^error: .*" + words, err, re.MULTILINE), err
    _count("7 invisible reference text", "cli", 3)


@pytest.mark.parametrize("text", list(INVISIBLE.values()), ids=list(INVISIBLE))
def test_invisible_reference_text_is_refused_as_input_text_is_node(ctx, nodes, text):
    m, refs = nodes["m"], nodes["refs"]
    gen = m("nodes/node_generate.py")
    assert "text is empty" in gen.CustomVoice.validate_inputs(text=text, language="Auto", speaker="Ryan")
    _refused(lambda: gen.CustomVoice.execute(model=refs["custom_voice"], text=text, speaker="Ryan", language="Auto",
                                             seed=0, takes=1, max_new_tokens=2), "text " + EMPTY)
    audio = {"waveform": torch.from_numpy(_tone())[None, None], "sample_rate": 24000}
    _refused(lambda: m("nodes/node_voice.py").ExtractSpeakerEmbedding.execute(
        model=refs["base"], audio=audio, batch_index=0, ref_text=text), "ExtractSpeakerEmbedding: the ref_text " + EMPTY)
    name = "invisible_" + str(list(INVISIBLE.values()).index(text))
    _write_voice(nodes["voices"] / f"{name}.safetensors", ctx["icl"], ctx["icl"].ref_codes, ref_text=text)
    _refused(lambda: m("nodes/node_voice.py").LoadVoice.execute(model=refs["base"], voice_name=name),
             "no reference text")
    _count("7 invisible reference text", "node", 3)


def test_blank_reference_text_still_means_x_vector_only(ctx):
    for blank in ("", "   ", "\n\t"):
        assert not ctx["engines"]["base"].extract_voice(_tone(), 24000, ref_text=blank).is_icl
    _count("7 invisible reference text", "engine")


def test_summary(figure):
    assert OUTCOMES, "run with the other tests of this file"
    figure(cases=sum(OUTCOMES.values()), by_class_and_surface={f"{c} / {s}": n for (c, s), n in sorted(OUTCOMES.items())})
