"""Sampling overrides, checkpoint/voice paths (pure helpers)."""
import json
import os

import pytest

from tests.support._q3support import load_pure

sampling = load_pure("sampling")
paths = load_pure("paths")


def test_sampling_defaults_change_nothing():
    assert sampling.sampling_changes() == {}
    assert sampling.sampling_changes(**{w: -1 for w in sampling.NUMERIC}, do_sample="checkpoint") == {}


def test_sampling_overrides_map_to_fields():
    ch = sampling.sampling_changes(temperature=0.5, top_k=10, sub_top_p=0.8, do_sample="greedy",
                                   sub_do_sample="sample", max_new_tokens=100)
    assert ch == {"temperature": 0.5, "top_k": 10, "subtalker_top_p": 0.8, "do_sample": False,
                  "subtalker_dosample": True, "max_new_tokens": 100}


def test_sampling_rejects_out_of_range():
    with pytest.raises(ValueError, match="top_p"):
        sampling.sampling_changes(top_p=1.5)
    with pytest.raises(ValueError):
        sampling.sampling_changes(do_sample="maybe")


@pytest.mark.parametrize("widget", sorted(sampling.OPEN_LOW))
def test_a_zero_the_engine_refuses_is_refused_by_the_widget_check(widget):
    """Temperature and top-p of 0 are refused before any load, naming the widget and the greedy switch, as
    the engine would refuse them at run time; the smallest step above 0 is accepted."""
    with pytest.raises(ValueError, match=rf"{widget} must be in \(0.0, .*greedy"):
        sampling.sampling_changes(**{widget: 0.0})
    assert list(sampling.sampling_changes(**{widget: 0.01}).values()) == [0.01]


def test_max_new_tokens_below_the_checkpoint_floor_lowers_the_floor():
    from engine.sampling import SamplingParams

    defaults = SamplingParams(min_new_tokens=2)
    params = sampling.with_changes(defaults, sampling.sampling_changes(max_new_tokens=1))
    assert (params.max_new_tokens, params.min_new_tokens) == (1, 1) and params.validate()
    assert sampling.with_changes(defaults, sampling.sampling_changes(max_new_tokens=5)).min_new_tokens == 2
    assert sampling.with_changes(defaults, {}) == defaults


def test_find_checkpoints_lists_dirs_with_config(tmp_path):
    own, foreign = tmp_path / "models" / "qwen3_tts", tmp_path / "models" / "TTS" / "Qwen3-TTS"
    for d in (own / "A", own / "org" / "B", foreign / "C", own / "voices", own / "A" / "speech_tokenizer"):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    (own / "not_a_ckpt").mkdir()
    roots = paths.candidate_roots(str(tmp_path / "models"), [str(own)], [])
    found = paths.find_checkpoints(roots)
    assert list(found) == ["A", "C", "org/B"]
    assert found["C"] == os.path.abspath(foreign / "C")


def test_voice_names_are_validated():
    assert paths.check_voice_name("my voice-1") == "my voice-1.safetensors"
    assert paths.check_voice_name("alice.safetensors") == "alice.safetensors"
    for bad in ("", "  ", "../x", "a/b", "a\\b", "..", ".hidden", "x" * 101):
        with pytest.raises(ValueError):
            paths.check_voice_name(bad)


def test_list_voices_and_repo_target(tmp_path):
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "b.safetensors").write_bytes(b"")
    (tmp_path / "v" / "a.safetensors").write_bytes(b"")
    (tmp_path / "v" / "note.txt").write_text("")
    assert paths.list_voices([str(tmp_path / "v"), str(tmp_path / "missing")]) == ["a", "b"]
    assert paths.repo_target("/m", "Qwen/Qwen3-TTS-12Hz-0.6B-Base") == os.path.join(
        "/m", "qwen3_tts", "Qwen3-TTS-12Hz-0.6B-Base")
    with pytest.raises(ValueError):
        paths.repo_target("/m", "someone/else")


def test_checkpoint_speakers_and_codec_choices(tmp_path):
    """The CustomVoice speaker list reads each CustomVoice checkpoint's own config.json (a fine-tuned speaker
    appears as written); the loader's codec choices are the checkpoints that carry speech_tokenizer/."""
    def ckpt(name, cfg, codec=False):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        if codec:
            (d / "speech_tokenizer").mkdir()
            (d / "speech_tokenizer" / "config.json").write_text("{}")
        return str(d)

    found = {
        "sft": ckpt("sft", {"tts_model_type": "custom_voice", "talker_config": {"vocab_size": 3072,
                                                                             "spk_id": {"My_Speaker": 3000}}}),
        "cv": ckpt("cv", {"tts_model_type": "custom_voice", "talker_config": {"vocab_size": 3072,
                                                                           "spk_id": {"ryan": 3061, "x": 3001}}},
                   codec=True),
        "base": ckpt("base", {"tts_model_type": "base", "talker_config": {"spk_id": {"hidden": 1}}}, codec=True),
        "broken": ckpt("broken", {}),
        "Qwen3-TTS-Tokenizer-12Hz": ckpt("tok", {"model_type": "qwen3_tts_tokenizer_12hz"}),
    }
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert paths.checkpoint_speakers(found.values()) == ["My_Speaker", "ryan", "x"]
    assert paths.codec_choices(found) == ["cv", "base", "Qwen3-TTS-Tokenizer-12Hz"]


@pytest.mark.parametrize("typed", ["Alice", " Alice", "Alice\t", "Alice\x00", "Al\u200bice", "\x1bAlice\x7f",
                                   "Alice .safetensors", "Alice\u0085"])
def test_voice_names_that_differ_only_in_spaces_or_control_characters_are_one_file(typed):
    assert paths.check_voice_name(typed) == "Alice.safetensors"
    assert paths.check_voice_name("my \t\n voice") == paths.check_voice_name("my voice") == "my voice.safetensors"


@pytest.mark.parametrize("typed", ["", "   ", "\x00", " \t\x07\u200b ", ".safetensors"])
def test_a_voice_name_of_nothing_but_spaces_or_control_characters_is_refused(typed):
    with pytest.raises(ValueError, match="empty|invalid voice name"):
        paths.check_voice_name(typed)


@pytest.mark.parametrize("prefix,clean", [("qwen3tts/subtitles", "qwen3tts/subtitles"), ("", "subtitles"),
                                          ("qwen3tts/", "qwen3tts/subtitles"), ("/", "subtitles"),
                                          (" qwen3tts // my\tsubs\x00 ", "qwen3tts/my subs"),
                                          ("a\\b\\", "a/b/subtitles"), (" \x00 ", "subtitles")])
def test_subtitle_prefix_always_names_a_file(prefix, clean):
    assert paths.subtitle_prefix(prefix) == clean


def test_an_unreadable_voice_folder_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.safetensors").write_bytes(b"")
    (tmp_path / "locked").mkdir()
    real = os.listdir

    def listdir(d):
        if str(d).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real(d)

    monkeypatch.setattr(os, "listdir", listdir)
    assert paths.list_voices([str(tmp_path / "locked"), str(tmp_path / "ok")]) == ["a"]
