"""In-process contract tests: load the pack with ComfyUI's own loader, check schemas and validation."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

import pytest
import torch

from tests.support._q3support import COMFYUI_DIR, PACK

NODE_IDS = ["LoadQwen3TTS", "ExtractSpeakerEmbedding", "SaveVoice", "LoadVoice", "VoiceClone", "CustomVoice",
            "VoiceDesign", "StreamChunks", "PickTake", "Script", "SaveSubtitles", "BlendVoices"]
PREFIX = "Qwen3TTSFast_"


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """ComfyUI's modules with the pack loaded by `nodes.load_custom_node`, on a temporary base dir."""
    base = tmp_path_factory.mktemp("inproc_base")
    ckpt = base / "models" / "qwen3_tts" / "Qwen3-TTS-12Hz-0.6B-CustomVoice"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (base / "models" / "TTS" / "Qwen3-TTS" / "Other").mkdir(parents=True)
    (base / "models" / "TTS" / "Qwen3-TTS" / "Other" / "config.json").write_text("{}")
    sys.path.insert(0, COMFYUI_DIR)
    sys.argv = ["main.py", "--cpu", "--base-directory", str(base)]
    import comfy.options
    comfy.options.enable_args_parsing()
    import utils.extra_config  # noqa: F401  (must precede `nodes`)
    import execution
    import nodes
    import server

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server.PromptServer(loop)
    before = {"env": dict(os.environ), "path": list(sys.path), "handlers": list(logging.root.handlers),
              "level": logging.root.level}
    ok = loop.run_until_complete(nodes.load_custom_node(str(PACK)))
    after = {"env": dict(os.environ), "path": list(sys.path), "handlers": list(logging.root.handlers),
             "level": logging.root.level}
    loop.run_until_complete(nodes.init_builtin_extra_nodes())
    yield {"nodes": nodes, "execution": execution, "loop": loop, "ok": ok, "before": before, "after": after,
           "base": base}
    loop.close()


def _validate(comfy, prompt: dict, node_id: str):
    execution = comfy["execution"]
    return comfy["loop"].run_until_complete(execution.validate_inputs("t", prompt, node_id, {}))


def test_pack_loads_and_registers_all_nodes(comfy):
    assert comfy["ok"] is True
    mappings = comfy["nodes"].NODE_CLASS_MAPPINGS
    for name in NODE_IDS:
        assert PREFIX + name in mappings, name
    web = comfy["nodes"].EXTENSION_WEB_DIRS
    assert any(os.path.samefile(p, PACK / "web") for p in web.values())


def test_import_has_no_global_side_effects(comfy):
    b, a = comfy["before"], comfy["after"]
    assert a["env"] == b["env"]
    assert a["path"] == b["path"]
    assert a["handlers"] == b["handlers"] and a["level"] == b["level"]
    heavy = [m for m in sys.modules if m.endswith(".engine.engine") or m.endswith(".engine.decode")]
    assert heavy == [], f"engine imported at pack import: {heavy}"


@pytest.mark.parametrize("name", NODE_IDS)
def test_schema(comfy, name):
    cls = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + name]
    info = cls.GET_NODE_INFO_V1()
    json.dumps(info, default=str)
    assert info["category"] == "audio/Qwen3-TTS"
    assert info["description"] and len(info["description"]) > 40
    assert info["display_name"] and "Qwen3-TTS" in info["display_name"]
    for section in ("required", "optional"):
        for inp, spec in info["input"].get(section, {}).items():
            assert spec[1].get("tooltip"), f"{name}.{inp} has no tooltip"
    assert all(info["output_tooltips"])


def test_generators_share_inputs(comfy):
    for name in ("VoiceClone", "CustomVoice", "VoiceDesign"):
        info = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + name].GET_NODE_INFO_V1()
        req = info["input"]["required"]
        assert req["seed"][1]["control_after_generate"] is True
        assert req["takes"][1]["min"] == 1 and req["takes"][1]["max"] >= 4
        assert req["language"][1]["options"][0] == "Auto" and len(req["language"][1]["options"]) == 11
        opt = info["input"]["optional"]
        for adv in ("temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens"):
            assert opt[adv][1]["default"] == -1, adv
        assert info["output"] == ["AUDIO"]
    for name in ("VoiceClone", "CustomVoice", "VoiceDesign", "StreamChunks"):
        first = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + name].GET_NODE_INFO_V1()["input"]["optional"]["first_take"]
        assert first[0] == "INT" and first[1]["default"] == 0 and first[1]["min"] == 0
        # not folded under "advanced" (Nodes 2.0 hides those): the example Notes tell users to set it
        assert first[1]["max"] == 2**32 - 1 and not first[1].get("advanced"), name


def test_inputs_the_example_notes_name_are_not_folded_under_advanced(comfy):
    """An input a workflow's Note tells users to set must be visible on the node in every renderer (Nodes 2.0
    folds inputs marked advanced away)."""
    import re

    named = 0
    for path in sorted((PACK / "example_workflows").glob("*.json")):
        wf = json.loads(path.read_text())
        notes = " ".join(n["widgets_values"][0] for n in wf["nodes"] if n["type"] == "Note")
        words = set(re.findall(r"[a-z_]+", notes))
        for node in wf["nodes"]:
            cls = comfy["nodes"].NODE_CLASS_MAPPINGS.get(node["type"])
            if node["type"] == "Note" or cls is None or not node["type"].startswith(PREFIX):
                continue
            info = cls.GET_NODE_INFO_V1()["input"]
            for name, spec in {**info.get("required", {}), **info.get("optional", {})}.items():
                if name in words and "_" in name:  # widget names the Notes spell out (first_take, ref_text, ...)
                    named += 1
                    assert not (len(spec) > 1 and spec[1].get("advanced")), f"{path.name}: {name} is advanced"
    assert named >= 2


def test_output_nodes(comfy):
    m = comfy["nodes"].NODE_CLASS_MAPPINGS
    for name in ("PickTake", "SaveVoice", "SaveSubtitles"):
        assert m[PREFIX + name].GET_NODE_INFO_V1()["output_node"] is True


def test_script_and_blend_schemas(comfy):
    m = comfy["nodes"].NODE_CLASS_MAPPINGS
    info = m[PREFIX + "Script"].GET_NODE_INFO_V1()
    assert info["output"] == ["AUDIO", "AUDIO", "STRING"] and info["output_name"] == ["track", "lines", "subtitles"]
    assert [k for k in info["input"]["optional"] if k.startswith("voice_")] == [f"voice_{i}" for i in range(1, 5)]
    blend = m[PREFIX + "BlendVoices"].GET_NODE_INFO_V1()
    assert list(blend["input"]["required"]) == ["voice_1", "weight_1", "voice_2", "weight_2"]
    assert blend["output"] == ["QWEN3TTS_VOICE"]


def _script_prompt(script, voices="Ava = Vivian\nBen = Ryan"):
    return {"1": {"class_type": PREFIX + "LoadQwen3TTS",
                  "inputs": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", "dtype": "auto", "cuda_graphs": "auto",
                             "triton": "auto", "max_takes": 4}},
            "2": {"class_type": PREFIX + "Script",
                  "inputs": {"model": ["1", 0], "script": script, "voices": voices, "language": "English",
                             "seed": 0, "line_gap": 0.3, "names_in_subtitles": True}}}


def test_valid_script_passes(comfy):
    ok, errors, _ = _validate(comfy, _script_prompt("Ava: Hi.\n\n[pause 1s]\nBen [tired]: Hello."), "2")
    assert ok is True, errors


@pytest.mark.parametrize("script, voices, needle", [
    ("Ava: Hi.\nZoe: Hello.", None, "script line 2: unknown name 'Zoe'"),
    ("Ava: Hi.\n\nBen:   ", None, "script line 3: 'Ben' has no text"),
    ("Ava: Hi.\n[pause soon]", None, "script line 2: malformed tag"),
    ("Ava: Hi.", "Ava Vivian", "voices line 1"),
    ("Ava: Hi.", "Ava = Vivian\nBen = Ryan\nAva = Serena", "voices line 3"),
])
def test_script_errors_are_node_errors_naming_the_line(comfy, script, voices, needle):
    prompt = _script_prompt(script) if voices is None else _script_prompt(script, voices)
    ok, errors, _ = _validate(comfy, prompt, "2")
    assert ok is False and "custom_validation_failed" in [e["type"] for e in errors]
    assert needle in json.dumps(errors), errors


def test_loader_lists_own_and_foreign_checkpoint_dirs(comfy):
    info = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "LoadQwen3TTS"].GET_NODE_INFO_V1()
    options = info["input"]["required"]["checkpoint"][1]["options"]
    assert options == ["Other", "Qwen3-TTS-12Hz-0.6B-CustomVoice"]
    import folder_paths
    assert folder_paths.get_folder_paths("qwen3_tts")[0] == str(comfy["base"] / "models" / "qwen3_tts")


def _gen_prompt(**overrides):
    inputs = {"model": ["1", 0], "text": "Hello.", "speaker": "Vivian", "language": "Auto", "seed": 1, "takes": 2}
    inputs.update(overrides)
    return {"1": {"class_type": PREFIX + "LoadQwen3TTS",
                  "inputs": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", "dtype": "auto", "cuda_graphs": "auto",
                             "triton": "auto", "max_takes": 4}},
            "2": {"class_type": PREFIX + "CustomVoice", "inputs": inputs}}


def test_valid_prompt_passes(comfy):
    ok, errors, _ = _validate(comfy, _gen_prompt(), "2")
    assert ok is True, errors


@pytest.mark.parametrize("overrides, kind", [
    ({"takes": 0}, "value_smaller_than_min"),
    ({"takes": 99}, "value_bigger_than_max"),
    ({"text": "   "}, "custom_validation_failed"),
    ({"speaker": "Nobody"}, "custom_validation_failed"),
    ({"language": "Klingon"}, "custom_validation_failed"),
    ({"top_p": 7.0}, "value_bigger_than_max"),
    ({"seed": -5}, "value_smaller_than_min"),
    ({"first_take": -1}, "value_smaller_than_min"),
    ({"first_take": 2**32}, "value_bigger_than_max"),
])
def test_bad_generator_widgets_are_rejected(comfy, overrides, kind):
    ok, errors, _ = _validate(comfy, _gen_prompt(**overrides), "2")
    assert ok is False
    assert kind in [e["type"] for e in errors], errors


@pytest.mark.parametrize("inputs, needle", [
    ({"checkpoint": "missing", "dtype": "auto"}, "not found"),
    ({"checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", "dtype": "int3"}, "dtype"),
])
def test_bad_loader_widgets_are_rejected(comfy, inputs, needle):
    base = {"cuda_graphs": "auto", "triton": "auto", "max_takes": 4}
    prompt = {"1": {"class_type": PREFIX + "LoadQwen3TTS", "inputs": base | inputs}}
    ok, errors, _ = _validate(comfy, prompt, "1")
    assert ok is False and needle in json.dumps(errors)


@pytest.mark.parametrize("name", ["../evil", "a/b", "", ".."])
def test_bad_voice_names_are_rejected(comfy, name):
    prompt = {"1": {"class_type": PREFIX + "SaveVoice", "inputs": {"voice": ["2", 0], "name": name, "overwrite": True}},
              "2": {"class_type": PREFIX + "LoadVoice", "inputs": {"model": ["3", 0], "voice_name": "x"}},
              "3": {"class_type": PREFIX + "LoadQwen3TTS", "inputs": {
                  "checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", "dtype": "auto", "cuda_graphs": "auto",
                  "triton": "auto", "max_takes": 4}}}
    ok, errors, _ = _validate(comfy, prompt, "1")
    assert ok is False and "voice name" in json.dumps(errors)


def test_pick_take_rejects_negative_index(comfy):
    prompt = {"1": {"class_type": PREFIX + "PickTake", "inputs": {"audio": ["2", 0], "index": -1}},
              "2": {"class_type": "EmptyAudio", "inputs": {"duration": 1.0, "sample_rate": 24000, "channels": 1}}}
    ok, errors, _ = _validate(comfy, prompt, "1")
    assert ok is False


def test_take_previews_play_at_the_level_saveaudio_saves(comfy):
    """PickTake's previews are mono like the take and hold its samples; SaveAudio's file of the same take has the
    same level (ComfyUI's V3 save helper would write mono as stereo at 0.707, 3 dB quieter)."""
    import av
    import folder_paths
    import numpy as np

    from tests.support._q3support import read_audio

    au = _pack_module("audio_utils")
    t = torch.arange(24000) / 24000
    wav = torch.stack([0.5 * torch.sin(2 * torch.pi * 220 * t), 0.25 * torch.sin(2 * torch.pi * 330 * t)])
    audio = au.make_audio(wav, [24000, 12000])
    out = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "PickTake"].execute(audio, 1)
    takes = out.ui["qwen3tts_takes"]
    assert [t["index"] for t in takes] == [0, 1] and takes[1]["samples"] == 12000
    saver = comfy["nodes"].NODE_CLASS_MAPPINGS["SaveAudio"]()
    saved = saver.save_flac(out.result[0], filename_prefix="level_check")["ui"]["audio"][0]
    ref, sr = read_audio(os.path.join(folder_paths.get_output_directory(), saved["subfolder"], saved["filename"]))
    for take, expected in zip(takes, wav):
        path = os.path.join(folder_paths.get_temp_directory(), take["subfolder"], take["filename"])
        with av.open(path) as f:
            assert f.streams.audio[0].channels == 1, "a mono take must be previewed as mono"
        got, rate = read_audio(path)
        assert rate == 24000 and np.abs(got - expected[: take["samples"]].numpy()).max() < 1.0 / 16000
    preview, _ = read_audio(os.path.join(folder_paths.get_temp_directory(), takes[1]["subfolder"],
                                         takes[1]["filename"]))
    assert sr == 24000 and ref.shape == preview.shape
    assert abs(20 * np.log10(np.sqrt(np.mean(preview**2)) / np.sqrt(np.mean(ref**2)))) < 0.01  # dB


def test_stream_start_message_says_when_the_prompt_was_queued(comfy, monkeypatch):
    """The player times first audio from the queue: the start message carries ComfyUI's create_time of the
    running prompt and the server's send time, on the same clock."""
    import time

    import server

    inst = server.PromptServer.instance
    sent = []
    monkeypatch.setattr(inst, "send_sync", lambda event, data, sid=None: sent.append((event, data)))
    monkeypatch.setattr(inst, "last_prompt_id", "prompt-q", raising=False)
    queued = int(time.time() * 1000) - 2500  # queued 2.5 s ago, behind other prompts and a model load
    inst.prompt_queue.put((0, "prompt-q", {}, {"create_time": queued}, [], {}))
    _, item_id = inst.prompt_queue.get()  # running now, as ComfyUI's worker takes it
    try:
        send = _pack_module("node_stream")._sender("5")
        send({"phase": "start", "sample_rate": 24000, "segments": 1, "chunk_frames": 8})
        send({"phase": "chunk", "seq": 0, "samples": 4, "pcm": torch.zeros(4)})
    finally:
        inst.prompt_queue.currently_running.pop(item_id)
    start, chunk = [d for e, d in sent if e == "qwen3tts_fast.stream"]
    assert start["prompt_id"] == "prompt-q" and start["queued_ms"] == queued
    assert 2500 <= start["sent_ms"] - queued < 60_000
    assert "queued_ms" not in chunk
    monkeypatch.setattr(inst, "last_prompt_id", "not-running", raising=False)
    send({"phase": "start", "sample_rate": 24000, "segments": 1, "chunk_frames": 8})
    assert sent[-1][1]["queued_ms"] is None  # unknown: the player falls back to the prompt's start


def _pack_module(suffix: str):
    # "." + suffix: the test modules of tests/nodes (test_unit_comfy_api_compat) must not match
    return next(m for name, m in sys.modules.items() if name.endswith("." + suffix) and "nodes" in name)


@pytest.mark.parametrize("prefix,folder,name", [("", "", "subtitles"), ("qwen3tts/", "qwen3tts", "subtitles"),
                                                 ("  qwen3tts / my\tsubs\x00 ", "qwen3tts", "my subs")])
def test_save_subtitles_numbers_every_run_and_cleans_the_prefix(comfy, prefix, folder, name):
    """A prefix that names only a folder (or nothing) still gets ComfyUI's numbered files: a new one each run."""
    import folder_paths

    node = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "SaveSubtitles"]
    saved = [node.execute(f"1\n00:00:00,000 --> 00:00:01,000\nrun {i}\n", prefix).ui["subtitles"][0]
             for i in range(2)]
    assert saved[0]["filename"] != saved[1]["filename"], saved
    for i, entry in enumerate(saved):
        assert entry["subfolder"] == folder and entry["filename"].startswith(name + "_"), entry
        path = os.path.join(folder_paths.get_output_directory(), entry["subfolder"], entry["filename"])
        with open(path, encoding="utf-8") as f:
            assert f.read().endswith(f"run {i}\n")


@pytest.mark.parametrize("prefix", ["../outside/subs", "/"])
def test_save_subtitles_path_errors_are_node_messages(comfy, prefix):
    node = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "SaveSubtitles"]
    if prefix == "/":  # a folder alone: saved as 'subtitles' in the output folder, never an error
        assert node.execute("x", prefix).ui["subtitles"][0]["filename"].startswith("subtitles_")
        return
    with pytest.raises(ValueError, match="^SaveSubtitles: filename_prefix .* points outside the output folder"):
        node.execute("x", prefix)


class _FakeVoice:
    def __init__(self, payload: bytes):
        self.payload = payload

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.payload)


def test_voice_names_are_cleaned_before_the_overwrite_check(comfy):
    """' Alice\t' is the voice 'Alice': it is refused with overwrite off, and with overwrite on too (overwrite
    replaces the voice typed exactly, never one a cleaned name hits); a name of only spaces and control
    characters is refused with a node message. (The pack's InvalidInputError is a ValueError, imported under the
    pack's own module name.)"""
    save = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "SaveVoice"]
    voices = _pack_module("comfy_paths").voice_save_dir()
    assert save.execute(_FakeVoice(b"first"), "Alice", True).result == ("Alice",)
    for typed in (" Alice\t", "Alice\x00", "Al\u200bice", "Alice .safetensors"):
        with pytest.raises(ValueError, match="^SaveVoice: a voice named 'Alice' exists"):
            save.execute(_FakeVoice(b"second"), typed, False)
    with open(os.path.join(voices, "Alice.safetensors"), "rb") as f:
        assert f.read() == b"first"
    with pytest.raises(ValueError, match="^SaveVoice: the name ' Alice.*' is saved as 'Alice'.*type 'Alice' exactly"):
        save.execute(_FakeVoice(b"third"), " Alice\t", True)
    out = save.execute(_FakeVoice(b"fourth"), "Alice", True)
    assert out.result == ("Alice",) and "replaced the voice 'Alice'" in out.ui["text"][0]
    assert save.execute(_FakeVoice(b"x"), " Carol\t", True).ui["text"][0].endswith("was saved as 'Carol' (spaces and "
                                                                                  "control characters cleaned)")
    assert sorted(f for f in os.listdir(voices) if f.startswith("Al")) == ["Alice.safetensors"]
    with pytest.raises(ValueError, match="^SaveVoice: voice name is empty"):
        save.execute(_FakeVoice(b"x"), " \x00\t ", True)


def test_voice_path_errors_are_node_messages(comfy, monkeypatch):
    load = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "LoadVoice"]
    with pytest.raises(ValueError, match="^LoadVoice: voice 'nobody' not found; looked for nobody.safetensors"):
        load.execute(None, "nobody")
    save = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "SaveVoice"]

    def full_disk(path):
        raise OSError(28, "No space left on device")

    voice = _FakeVoice(b"")
    monkeypatch.setattr(voice, "save", full_disk)
    with pytest.raises(RuntimeError, match="^SaveVoice: could not write .*Bob.safetensors \\(No space left"):
        save.execute(voice, "Bob", True)
    voices = _pack_module("comfy_paths").voice_save_dir()
    assert not [f for f in os.listdir(voices) if "Bob" in f], "the temporary file is removed"


@pytest.mark.engine
def test_loader_errors_are_node_messages(comfy, monkeypatch):
    """A folder that is no loadable checkpoint, or files that cannot be read: errors naming LoadQwen3TTS."""
    loader = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "LoadQwen3TTS"]
    with pytest.raises(RuntimeError, match="^LoadQwen3TTS: "):  # the fixture's config.json is '{}'
        loader.execute("Qwen3-TTS-12Hz-0.6B-CustomVoice", "fp32", "off", "off", 1)
    cache = _pack_module("engine_cache")

    def unreadable(key):
        raise PermissionError(13, "Permission denied", os.path.join(key.model_dir, "model.safetensors"))

    monkeypatch.setattr(cache, "acquire", unreadable)
    with pytest.raises(RuntimeError, match="^LoadQwen3TTS: could not read the checkpoint .*Permission denied: .*"
                                           "model.safetensors\\); check that"):
        loader.execute("Qwen3-TTS-12Hz-0.6B-CustomVoice", "fp32", "off", "off", 1)


def test_download_without_network_says_where_to_put_the_files(comfy, monkeypatch):
    """No network (simulated: nothing may leave this machine): the error names the repo and the folder."""
    import huggingface_hub

    def offline(**_):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    paths = _pack_module("comfy_paths")
    with pytest.raises(RuntimeError) as err:
        paths.download("Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    text = str(err.value)
    target = comfy["base"] / "models" / "qwen3_tts" / "Qwen3-TTS-12Hz-0.6B-Base"
    assert "Qwen/Qwen3-TTS-12Hz-0.6B-Base" in text and str(target) in text and "config.json" in text
    assert not (target / "config.json").exists()


def test_loading_a_file_that_is_not_a_voice_is_a_clear_error(comfy, tmp_path):
    from safetensors.torch import save_file

    voices = comfy["base"] / "models" / "qwen3_tts" / "voices"
    voices.mkdir(parents=True, exist_ok=True)
    save_file({"weight": torch.zeros(3)}, str(voices / "not_a_voice.safetensors"))
    paths = _pack_module("comfy_paths")
    from engine import Voice
    from engine.errors import VoiceError

    with pytest.raises(VoiceError, match="not a Qwen3-TTS Fast voice"):
        Voice.load(paths.find_voice("not_a_voice"))


def test_the_pinned_v3_api_module_is_used(comfy):
    """On ComfyUI 0.3.75 the shim takes comfy_api.v0_0_2 (the versioned module ComfyUI's docs recommend), and an
    advanced input carries "advanced": true in the node info on a backend whose Input has no advanced= yet."""
    compat = _pack_module("comfy_api_compat")
    import comfy_api.v0_0_2

    assert compat.API_MODULE == "comfy_api.v0_0_2" and compat.io is comfy_api.v0_0_2.io
    spec = compat.advanced(compat.io.Int.Input("n", default=0, tooltip="t")).as_dict()
    assert spec["advanced"] is True and spec["tooltip"] == "t"


@pytest.mark.engine
@pytest.mark.parametrize("waveform,rate,needle", [
    (torch.zeros(1, 1, 0), 24000, "empty"),
    (torch.full((1, 1, 48000), float("nan")), 24000, "NaN"),
    (torch.full((1, 2, 48000), 0.2), 1, "invalid sample rate"),
    (torch.full((1, 1, 48000), 0.2), 10**10, "invalid sample rate"),
])
def test_unusable_reference_audio_is_a_node_error(comfy, tmp_path_factory, waveform, rate, needle):
    """Reference AUDIO that cannot be resampled: an error naming the node and what is wrong, not a crash."""
    from engine.checkpoint.writer import ensure_random_checkpoint

    ckpt = tmp_path_factory.getbasetemp() / "bad_ref_base"
    ensure_random_checkpoint(ckpt, "tiny", "base")
    cache = _pack_module("engine_cache")
    key = cache.EngineConfig(model_dir=str(ckpt), device="cpu", dtype="fp32", cuda_graphs="off", triton="off",
                          max_takes=1)
    ref = cache.ModelRef(key=key, name="bad_ref_base", model_type="base")
    node = comfy["nodes"].NODE_CLASS_MAPPINGS[PREFIX + "ExtractSpeakerEmbedding"]
    with pytest.raises(RuntimeError, match=f"ExtractSpeakerEmbedding: reference audio.*{needle}"):
        node.execute(ref, {"waveform": waveform, "sample_rate": rate}, 0, ref_text="Some words.")
    cache.release(key)


@pytest.mark.engine
def test_finetuned_speaker_is_listed_and_a_repacked_folder_borrows_a_codec(comfy):
    """A fine-tuned checkpoint's own speaker appears in CustomVoice's speaker list and validates; a folder without
    speech_tokenizer/ loads with a sibling's codec (auto) or the one chosen in the loader, and the info says so."""
    import shutil

    from engine.checkpoint.writer import write_random_checkpoint

    root = comfy["base"] / "models" / "qwen3_tts"
    complete = write_random_checkpoint(root / "zz-tiny-cv", "tiny", "custom_voice")
    repacked = shutil.copytree(complete, root / "zz-tiny-sft", ignore=shutil.ignore_patterns("speech_tokenizer"))
    cfg = json.loads((repacked / "config.json").read_text())
    cfg["talker_config"]["spk_id"] = {"Speaker_Test": 3000}
    cfg["talker_config"]["spk_is_dialect"] = {"Speaker_Test": False}
    (repacked / "config.json").write_text(json.dumps(cfg))
    mappings = comfy["nodes"].NODE_CLASS_MAPPINGS
    try:
        for node in ("CustomVoice", "StreamChunks"):
            info = mappings[PREFIX + node].GET_NODE_INFO_V1()
            section = "required" if "speaker" in info["input"]["required"] else "optional"
            options = info["input"][section]["speaker"][1]["options"]
            assert options[:9] == ["Vivian", "Serena", "Uncle_Fu", "Dylan", "Eric", "Ryan", "Aiden", "Ono_Anna",
                                   "Sohee"] and options[9:] == ["Speaker_Test"], options
        prompt = _gen_prompt(speaker="Speaker_Test")
        prompt["1"]["inputs"]["checkpoint"] = "zz-tiny-sft"
        ok, errors, _ = _validate(comfy, prompt, "2")
        assert ok is True, errors
        loader_info = mappings[PREFIX + "LoadQwen3TTS"].GET_NODE_INFO_V1()
        assert loader_info["input"]["optional"]["codec"][1]["options"][1:] == ["zz-tiny-cv"]
        loader = mappings[PREFIX + "LoadQwen3TTS"]
        cache = _pack_module("engine_cache")
        for codec, says in (("auto (its own, else a sibling's)", "found automatically"),
                            ("zz-tiny-cv", "chosen by the user")):
            out = loader.execute("zz-tiny-sft", "fp32", "off", "off", 1, codec=codec)
            ref, text = out.result
            assert says in text and str(complete.resolve() / "speech_tokenizer") in text, text
            assert "RANDOM weights" in text.splitlines()[1] and "noise" in text, text  # RANDOM_WEIGHTS.json
            assert cache.release(ref.key)
    finally:
        shutil.rmtree(repacked)
        shutil.rmtree(complete)
