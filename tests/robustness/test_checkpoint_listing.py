"""A malformed checkpoint folder never affects another: the node lists (checkpoints, codecs, CustomVoice
speakers) are built from what can be read, the bad folder still appears in the checkpoint list, and choosing it
gives its typed error (LoadQwen3TTS, in a real in-process ComfyUI); a good checkpoint next to it loads."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support import comfy_nodes
from tests.support import config_mutants as M
from tests.support._q3support import load_pure, need

paths = load_pure("paths")
EXTRA_SPEAKER = "my_fine_tuned_speaker"  # the good checkpoint's own speaker: it must reach the speaker list


def _talker(cfg: dict) -> dict:
    return cfg["talker_config"]


# name -> how a CustomVoice config.json is damaged (a callable on the folder, given the good config)
BAD_FOLDERS = {
    "nested_too_deeply": lambda d, cfg: (d / "config.json").write_text("[" * 100_000 + "]" * 100_000),
    "not_an_object": lambda d, cfg: (d / "config.json").write_text("[1, 2]"),
    "not_utf8": lambda d, cfg: (d / "config.json").write_bytes(b"\xff\xfe{\x00"),
    "empty": lambda d, cfg: (d / "config.json").write_text(""),
    "talker_config_a_list": lambda d, cfg: _write(d, {**cfg, "talker_config": [1]}),
    "speakers_a_list": lambda d, cfg: _write(d, {**cfg, "talker_config": {**_talker(cfg), "spk_id": ["x"]}}),
    "speaker_ids_strings": lambda d, cfg: _write(d, {**cfg, "talker_config": {**_talker(cfg),
                                                                               "spk_id": {"bad_speaker": "7"}}}),
    "speaker_ids_nested": lambda d, cfg: (d / "config.json").write_text(json.dumps(
        {**cfg, "talker_config": {**_talker(cfg), "spk_id": {"bad_speaker": "__deep__"}}}).replace(
        '"__deep__"', "[" * 64 + "7" + "]" * 64)),
    "model_type_an_object": lambda d, cfg: _write(d, {**cfg, "tts_model_type": {"custom_voice": 1}}),
    "speaker_id_past_vocab": lambda d, cfg: _write(d, {**cfg, "talker_config": {**_talker(cfg),
                                                                                 "spk_id": {"bad_speaker": 99999}}}),
}
if sys.platform != "win32":
    BAD_FOLDERS["config_is_a_fifo"] = lambda d, cfg: ((d / "config.json").unlink(), os.mkfifo(d / "config.json"))
# Loading these must fail with a typed error naming config.json (a FIFO is named as missing: not a file).
UNLISTED_SPEAKERS = {"bad_speaker", "x"}


def _write(d: Path, cfg: dict) -> None:
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def models(tiny_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """A models folder: one good CustomVoice checkpoint (with a speaker of its own) and one of each bad kind,
    each a full checkpoint whose files link to the tiny one's."""
    root = tmp_path_factory.mktemp("qwen3_tts_models")
    source = tiny_checkpoints["custom_voice"]
    cfg = json.loads((source / "config.json").read_text())
    good = M.Workspace(source, root, "good")
    good_cfg = json.loads(json.dumps(cfg))
    good_cfg["talker_config"]["spk_id"][EXTRA_SPEAKER] = 3000
    good.write("config.json", json.dumps(good_cfg))
    out = {"good": good.dir}
    for name, damage in BAD_FOLDERS.items():
        ws = M.Workspace(source, root, name)
        ws.write("config.json", "{}")
        damage(ws.dir, cfg)
        out[name] = ws.dir
    return out


def test_one_bad_folder_never_breaks_the_lists(models):
    root = str(models["good"].parent)
    found = paths.find_checkpoints([root])
    listed = {Path(d).name for d in found.values()}
    assert listed == set(models), "every folder with a config.json is listed, the bad ones too"
    speakers = paths.checkpoint_speakers(found.values())
    assert EXTRA_SPEAKER in speakers and "ryan" in speakers
    assert not UNLISTED_SPEAKERS & set(speakers), speakers
    assert set(paths.codec_choices(found)) == set(found), "each has speech_tokenizer/"


@pytest.fixture(scope="module")
def comfy(models, tmp_path_factory):
    need(comfy_nodes.missing())
    comfy_nodes.load_pack(tmp_path_factory.mktemp("comfy_base"))
    import folder_paths

    root = str(models["good"].parent)
    folder_paths.add_model_folder_path("qwen3_tts", root)
    m = comfy_nodes.pack_module
    yield m("nodes/node_loader.py").LoadQwen3TTS, m("nodes/node_generate.py").CustomVoice, m("nodes/common.py")
    folder_paths.folder_names_and_paths["qwen3_tts"][0].remove(root)


def _typed(exc) -> BaseException | None:
    while exc is not None:
        if any(c.__name__ == "Qwen3TTSError" for c in type(exc).__mro__):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _name(comfy_paths_names: list, folder: str) -> str:
    return next(n for n in comfy_paths_names if n.split("/")[-1] == folder)


def test_nodes_register_and_list_what_loads(comfy, models):
    loader, custom_voice, common = comfy
    schema = loader.define_schema()  # what registering the node runs: it must not fail for any folder
    names = next(i for i in schema.inputs if i.id == "checkpoint").options
    for folder in models:
        _name(names, folder)  # the bad folders appear too, so choosing one can say what is wrong
    custom_voice.define_schema()
    speakers = common.speaker_options()
    assert EXTRA_SPEAKER in speakers and not UNLISTED_SPEAKERS & set(speakers)


@pytest.mark.parametrize("folder", list(BAD_FOLDERS))
def test_choosing_a_bad_folder_gives_its_typed_error(comfy, models, folder):
    loader = comfy[0]
    names = next(i for i in loader.define_schema().inputs if i.id == "checkpoint").options
    with pytest.raises(Exception) as err:
        loader.execute(checkpoint=_name(names, folder), dtype="fp32", cuda_graphs="off", triton="off", max_takes=1)
    typed = _typed(err.value)
    assert typed is not None and type(typed).__name__ == "CheckpointError", repr(err.value)
    assert "config.json" in str(err.value) and "LoadQwen3TTS" in str(err.value)


def test_a_good_folder_next_to_bad_ones_loads(comfy, models):
    loader = comfy[0]
    names = next(i for i in loader.define_schema().inputs if i.id == "checkpoint").options
    out = loader.execute(checkpoint=_name(names, "good"), dtype="fp32", cuda_graphs="off", triton="off", max_takes=1)
    assert "custom_voice" in out.args[1]
