"""Every numeric widget of every node accepts what the engine accepts, walked from the nodes' own INPUT_TYPES
(in an in-process ComfyUI, with tiny checkpoints whose EOS comes early, so a run at a widget's largest frame
budget ends in a few frames).

For every INT and FLOAT input of every node of the pack, each value is run through the node's execute with all
other inputs at their defaults:

* the widget's min and max must run through the engine, end to end;
* a widget whose min is the -1 "checkpoint default" sentinel also gets the engine's own lowest value (run, or,
  where the engine's range is open there as temperature 0, refused naming the widget before any engine work)
  and a value in the gap between -1 and it (refused the same way);
* one step past each bound must be refused with a typed error naming the widget, unless the engine itself
  takes the value and the node leaves the range check to ComfyUI (ComfyUI checks min and max before execute
  for every input a node's validate_inputs does not name).
"""
from __future__ import annotations

import inspect
import os
import re
import shutil

import numpy as np
import pytest
import torch

from tests.support import comfy_nodes
from tests.support._q3support import need
from tests.support.bad_inputs import project_error

OUTCOMES: dict[str, int] = {"ran": 0, "refused": 0, "left to ComfyUI": 0}
NODE_MODEL = {"VoiceClone": "base", "ExtractSpeakerEmbedding": "base", "CustomVoice": "custom_voice",
              "StreamChunks": "custom_voice", "Script": "custom_voice", "VoiceDesign": "voice_design",
              "LoadVoice": "base"}
TAKES = 64  # the AUDIO batches PickTake and ExtractSpeakerEmbedding get: as many items as their index widgets allow


@pytest.fixture(scope="module")
def pack(tmp_path_factory, eos_checkpoint, eos_base_checkpoint):
    need(comfy_nodes.missing())
    from engine.checkpoint.writer import write_random_checkpoint

    root = tmp_path_factory.mktemp("widget_ckpts")
    shutil.copytree(eos_checkpoint, root / "tiny-custom_voice")
    shutil.copytree(eos_base_checkpoint, root / "tiny-base")
    write_random_checkpoint(root / "tiny-voice_design", "tiny", "voice_design", seed=0, eos=True, eos_scale=4.0)
    comfy_nodes.load_pack(tmp_path_factory.mktemp("comfy_base"))
    import folder_paths

    folder_paths.add_model_folder_path("qwen3_tts", str(root))
    m = comfy_nodes.pack_module
    cache, limits = m("nodes/engine_cache.py"), m("engine/limits.py")
    refs = {kind: cache.ModelRef(key=cache.EngineConfig(model_dir=os.path.realpath(root / f"tiny-{kind}"), device="cpu",
                                                        dtype="fp32", cuda_graphs="auto", triton="auto",
                                                        max_takes=limits.MAX_TAKES),
                                 name=f"tiny-{kind}", model_type=kind)
            for kind in ("base", "custom_voice", "voice_design")}
    engine = cache.acquire(refs["base"].key)
    t = np.arange(24000) / 24000.0
    tone = torch.tensor(0.3 * np.sin(2 * np.pi * 150 * t), dtype=torch.float32)
    voice = engine.extract_voice(tone, 24000)
    other = engine.extract_voice(torch.roll(tone, 100) * 0.5 + 0.1 * torch.sin(torch.arange(24000) * 0.3), 24000)
    takes = m("nodes/audio_utils.py").make_audio(torch.rand(TAKES, 480) * 0.1, [480] * TAKES, 24000)
    yield {"m": m, "refs": refs, "voice": voice, "other": other, "takes": takes,
           "batch": {"waveform": tone.expand(TAKES, 1, -1).clone(), "sample_rate": 24000}}
    folder_paths.folder_names_and_paths["qwen3_tts"][0].remove(str(root))


def _nodes(pack) -> dict:
    m = pack["m"]
    return {n.__name__: n for n in m("nodes/extension.py").NODES}


def _widgets(node) -> list[tuple[str, str, dict]]:
    types = node.INPUT_TYPES()
    return [(name, spec[0], spec[1]) for section in ("required", "optional")
            for name, spec in types.get(section, {}).items() if spec[0] in ("INT", "FLOAT")]


def _defaults(node) -> dict:
    out = {}
    for section in ("required", "optional"):
        for name, spec in node.INPUT_TYPES().get(section, {}).items():
            opts = spec[1] if len(spec) > 1 else {}
            if "default" in opts:
                out[name] = opts["default"]
            elif isinstance(spec[0], list) and spec[0]:
                out[name] = spec[0][0]
    return out


def _inputs(pack, name: str, node) -> dict:
    """Every input of the node: widget defaults, and a real value for each link."""
    kw = _defaults(node)
    refs = pack["refs"]
    if name in NODE_MODEL:
        kw["model"] = refs[NODE_MODEL[name]]
    if name == "VoiceClone":
        kw["voice"] = pack["voice"]
    elif name == "ExtractSpeakerEmbedding":
        kw["audio"] = pack["batch"]
    elif name == "PickTake":
        kw["audio"] = pack["takes"]
    elif name == "BlendVoices":
        kw.update(voice_1=pack["voice"], voice_2=pack["other"], voice_3=pack["voice"], voice_4=pack["other"])
    elif name == "LoadQwen3TTS":
        kw["checkpoint"] = "tiny-custom_voice"
    elif name == "StreamChunks":
        kw["voice"] = None
    return kw


def _validated(node) -> set[str]:
    """Inputs named by the node's validate_inputs: ComfyUI skips its own min/max check for them."""
    fn = getattr(node, "validate_inputs", None) or getattr(node, "VALIDATE_INPUTS", None)
    return set(inspect.signature(fn).parameters) if fn is not None else set()


def _values(pack, name: str, widget: str, kind: str, opts: dict) -> list[tuple[str, object, str]]:
    """(label, value, expectation): "run", "refuse", "refuse or engine" (past a bound) or "refuse early"."""
    lo, hi = opts["min"], opts["max"]
    step = opts.get("step") or 1
    if kind == "INT":
        step = 1
    cast = int if kind == "INT" else float
    vals = [("min", lo, "run"), ("max", hi, "run"), ("below min", cast(lo - step), "refuse or engine"),
            ("above max", cast(hi + step), "refuse or engine")]
    sampling = pack["m"]("nodes/sampling.py")
    if lo == sampling.DEFAULT and widget in sampling.NUMERIC:
        real_lo = sampling.NUMERIC[widget][2]
        vals.append(("engine's lowest", cast(real_lo), "refuse early" if widget in sampling.OPEN_LOW else "run"))
        vals.append(("between -1 and the engine's lowest", cast((lo + real_lo) / 2) if kind == "FLOAT" else None,
                     "refuse early"))
        vals = [v for v in vals if v[1] is not None and not (kind == "INT" and v[1] == lo + 1 and real_lo == 0)]
        if kind == "INT" and real_lo > lo + 1:
            vals.append(("between -1 and the engine's lowest", lo + 1, "refuse early"))
    return [(label, v, exp) for label, v, exp in dict.fromkeys(vals)]


def _cases():
    """Node and widget names, read from the pack's source of truth at collection time without ComfyUI: the
    walk itself reads INPUT_TYPES; this list only names the test ids (a widget missing here fails the last
    test, which compares the two)."""
    return [pytest.param(n, id=n) for n in ("LoadQwen3TTS", "ExtractSpeakerEmbedding", "VoiceClone", "CustomVoice",
                                              "VoiceDesign", "StreamChunks", "PickTake", "Script", "BlendVoices",
                                              "SaveVoice", "LoadVoice", "SaveSubtitles")]


WALKED: set[tuple[str, str]] = set()
LEFT: list[str] = []  # values past a widget's bound that the engine takes (ComfyUI refuses them first)


@pytest.mark.parametrize("name", _cases())
def test_every_numeric_widget_range_is_what_the_engine_accepts(pack, name, monkeypatch):
    import server

    monkeypatch.setattr(server.PromptServer, "instance", None)
    node = _nodes(pack)[name]
    if name == "StreamChunks":
        node = node.PREPARE_CLASS_CLONE({})
    cache = pack["m"]("nodes/engine_cache.py")
    real, reached = cache.acquire, []
    monkeypatch.setattr(cache, "acquire", lambda key: reached.append(key) or real(key))
    failures = []
    for widget, kind, opts in _widgets(node):
        WALKED.add((name, widget))
        for label, value, expect in _values(pack, name, widget, kind, opts):
            kw = _inputs(pack, name, node)
            kw[widget] = value
            if widget.startswith("weight_"):  # the other weights stay 1: a blend of weight 0 alone is no blend
                kw.update({w: 1.0 for w in ("weight_1", "weight_2", "weight_3", "weight_4") if w != widget})
            reached.clear()
            try:
                node.execute(**kw)
                outcome, message = "ran", ""
            except Exception as exc:  # noqa: BLE001 - classified below
                typed = project_error(exc)
                outcome, message = ("refused" if typed is not None else f"untyped {type(exc).__name__}"), str(exc)
            where = f"{name}.{widget} = {value!r} ({label})"
            if expect == "run" and outcome != "ran":
                failures.append(f"{where}: the widget allows it but it was {outcome}: {message}")
            elif expect.startswith("refuse"):
                if outcome == "refused" and not re.search(rf"\b{re.escape(widget)}\b", message):
                    failures.append(f"{where}: refused without naming {widget}: {message}")
                elif outcome == "ran" and (expect != "refuse or engine" or widget in _validated(node)):
                    failures.append(f"{where}: accepted, but {'ComfyUI does not check it' if expect != 'refuse early' else 'it is outside the engine range'}")
                elif outcome.startswith("untyped"):
                    failures.append(f"{where}: {outcome}: {message}")
                elif expect == "refuse early" and reached and name != "LoadQwen3TTS":
                    failures.append(f"{where}: refused only after the engine was reached")
            key = "left to ComfyUI" if expect == "refuse or engine" and outcome == "ran" else outcome
            if key == "left to ComfyUI":
                LEFT.append(f"{name}.{widget}={value!r}")
            OUTCOMES[key] = OUTCOMES.get(key, 0) + 1
    assert not failures, "\n".join(failures)


def test_every_widget_was_walked(pack, figure):
    every = {(name, w) for name, node in _nodes(pack).items() for w, _, _ in _widgets(node)}
    assert every and every == WALKED, f"not walked: {sorted(every - WALKED)}"
    figure(nodes=len({n for n, _ in every}), numeric_widgets=len(every), values=sum(OUTCOMES.values()), **OUTCOMES,
           past_a_bound_but_valid_for_the_engine=LEFT)
