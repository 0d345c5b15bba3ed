"""Fine-tuned and repacked checkpoints: speakers from their own config.json, and folders without speech_tokenizer/.

The folders are made from the writer's tiny random checkpoints the way users get them:
* "sft": what the official single-speaker SFT script (finetuning/sft_12hz.py) writes from a Base checkpoint:
  tts_model_type custom_voice, spk_id {name: 3000}, spk_is_dialect {name: false}, speaker_encoder.* weights
  dropped, codec_embedding row 3000 set to the speaker's embedding;
* "extra": a CustomVoice checkpoint with one more speaker (id 3001) beside the nine;
* "renamed": a CustomVoice checkpoint whose "ryan" is called something else;
* "no codec": any of them repacked without speech_tokenizer/.
Parity is checked against the official qwen-tts 0.1.1 wherever it can load the folder (CPU fp32, greedy).
"""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, Request
from engine.errors import CheckpointError, InvalidInputError
from tests.support.decoding import oracle_greedy
from tests.support.reference_files import voiced_signal

FRAMES = 8
SFT_ID = 3000
TEXT = "A fine-tuned voice says hello."


def _edit_config(path, edit):
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def make_sft(base_dir, out, name: str):
    """The official SFT script's output layout, derived from a Base checkpoint."""
    shutil.copytree(base_dir, out)
    engine = Engine.load(base_dir, device="cpu", dtype="fp32")
    emb = engine.extract_voice(voiced_signal(24000)[0], 24000).spk_embedding
    weights = load_file(str(out / "model.safetensors"))
    weights = {k: v for k, v in weights.items() if not k.startswith("speaker_encoder")}
    weights["talker.model.codec_embedding.weight"][SFT_ID] = emb.to(torch.float32)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})

    def edit(cfg):
        cfg["tts_model_type"] = "custom_voice"
        cfg["talker_config"]["spk_id"] = {name: SFT_ID}
        cfg["talker_config"]["spk_is_dialect"] = {name: False}
    _edit_config(out, edit)
    return out


def make_speakers(custom_dir, out, rename=None, extra=None):
    """A CustomVoice checkpoint with speakers renamed ({old: new}) and/or added ({name: id})."""
    shutil.copytree(custom_dir, out)

    def edit(cfg):
        tc = cfg["talker_config"]
        for old, new in (rename or {}).items():
            tc["spk_id"][new] = tc["spk_id"].pop(old)
            tc["spk_is_dialect"][new] = tc["spk_is_dialect"].pop(old)
        for new, sid in (extra or {}).items():
            tc["spk_id"][new] = sid
            tc["spk_is_dialect"][new] = False
    _edit_config(out, edit)
    return out


def without_codec(src, out):
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("speech_tokenizer"))
    return out


@pytest.fixture(scope="module")
def layouts(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("finetuned")
    return {
        "sft": make_sft(tiny_checkpoints["base"], root / "sft" / "my-sft", "speaker_test"),
        "extra": make_speakers(tiny_checkpoints["custom_voice"], root / "extra", extra={"my_voice": 3001}),
        "renamed": make_speakers(tiny_checkpoints["custom_voice"], root / "renamed", rename={"ryan": "narrator"}),
        "mixed_case": make_speakers(tiny_checkpoints["custom_voice"], root / "mixed", rename={"ryan": "Narrator_X"}),
    }


def ours(path, speaker, **load):
    engine = Engine.load(path, device="cpu", dtype="fp32", **load)
    params = engine.defaults.greedy().replace(max_new_tokens=FRAMES)
    res = engine.generate(Request(mode="custom", text=TEXT, language="English", speaker=speaker), params=params)
    return engine, res


def official(qwen_tts, path, speaker):
    model = qwen_tts.Qwen3TTSModel.from_pretrained(str(path), device_map="cpu", dtype=torch.float32)
    seen, wavs = oracle_greedy(model, "generate_custom_voice", FRAMES, text=TEXT, language="English", speaker=speaker)
    return model, seen[0].to(torch.long), torch.from_numpy(wavs[0])


@pytest.mark.parametrize("layout,speaker", [("sft", "speaker_test"), ("extra", "my_voice"), ("extra", "ryan"),
                                            ("renamed", "narrator")])
def test_speakers_from_config_match_official(qwen_tts, layouts, layout, speaker):
    engine, res = ours(layouts[layout], speaker)
    model, codes, wav = official(qwen_tts, layouts[layout], speaker)
    assert engine.cfg.supported_speakers == sorted(s.lower() for s in model.get_supported_speakers())
    assert torch.equal(res.codes[0], codes)
    assert (res.audio[0, : res.lengths[0]] - wav).abs().max().item() <= 1e-4


def test_sft_checkpoint_is_custom_voice_with_its_one_speaker(layouts):
    engine = Engine.load(layouts["sft"], device="cpu", dtype="fp32")
    assert engine.model_type == "custom_voice" and engine.cfg.supported_speakers == ["speaker_test"]
    with pytest.raises(InvalidInputError, match="unknown speaker 'ryan'.*speaker_test"):
        engine.generate(Request(mode="custom", text=TEXT, speaker="ryan"))


def test_mixed_case_speaker_name(layouts):
    """A name written with capitals (the official package only finds lower-case spk_id keys) works in any case
    and speaks exactly like the same speaker under a lower-case name."""
    _, res = ours(layouts["mixed_case"], "Narrator_X")
    _, same = ours(layouts["mixed_case"], "narrator_x")
    _, lower = ours(layouts["renamed"], "narrator")
    assert torch.equal(res.codes[0], same.codes[0]) and torch.equal(res.codes[0], lower.codes[0])


def test_missing_codec_borrows_a_sibling_and_matches_official(qwen_tts, layouts, tmp_path):
    """A repacked SFT folder without speech_tokenizer/ next to a complete checkpoint: the sibling's codec is used
    and said so, and the output equals the official package on the complete folder."""
    parent = tmp_path / "models"
    bare = without_codec(layouts["sft"], parent / "my-sft-repacked")
    shutil.copytree(layouts["extra"], parent / "Qwen3-TTS-12Hz-0.6B-CustomVoice")
    engine, res = ours(bare, "speaker_test")
    assert engine.info.codec_origin == "sibling"
    assert engine.info.codec_dir == str((parent / "Qwen3-TTS-12Hz-0.6B-CustomVoice" / "speech_tokenizer").resolve())
    assert any("found automatically" in n for n in engine.info.notes)
    _, codes, wav = official(qwen_tts, layouts["sft"], "speaker_test")
    assert torch.equal(res.codes[0], codes)
    assert (res.audio[0, : res.lengths[0]] - wav).abs().max().item() <= 1e-4


def test_missing_codec_chosen_by_the_user(layouts, tmp_path):
    bare = without_codec(layouts["sft"], tmp_path / "alone" / "my-sft")
    with pytest.raises(CheckpointError, match=r"no speech_tokenizer/ folder.*codec.*--codec-dir"):
        Engine.load(bare, device="cpu", dtype="fp32")
    for chosen in (layouts["extra"], layouts["extra"] / "speech_tokenizer"):  # a checkpoint or its codec folder
        engine, res = ours(bare, "speaker_test", codec_dir=chosen)
        assert engine.info.codec_origin == "chosen" and "chosen by the user" in " ".join(engine.info.notes)
        _, own = ours(layouts["sft"], "speaker_test")
        assert torch.equal(res.audio, own.audio)
    with pytest.raises(CheckpointError, match="holds no Qwen3-TTS-12Hz codec"):
        Engine.load(bare, device="cpu", dtype="fp32", codec_dir=tmp_path)


def test_incompatible_or_broken_codecs_are_not_borrowed(layouts, tmp_path):
    parent = tmp_path / "models"
    bare = without_codec(layouts["sft"], parent / "my-sft")
    other = shutil.copytree(layouts["extra"], parent / "odd-codec")
    cfg_path = other / "speech_tokenizer" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["decoder_config"]["num_quantizers"] = 8
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no checkpoint next to it"):
        Engine.load(bare, device="cpu", dtype="fp32")
    with pytest.raises(CheckpointError, match="8 codebooks"):
        Engine.load(bare, device="cpu", dtype="fp32", codec_dir=other)
    half = shutil.copytree(layouts["extra"], tmp_path / "half")  # an incomplete own codec is an error
    (half / "speech_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="speech_tokenizer/model.safetensors"):
        Engine.load(half, device="cpu", dtype="fp32")


def test_cli_codec_dir(layouts, tmp_path):
    from tests.engine.test_cli import synth

    bare = without_codec(layouts["sft"], tmp_path / "alone" / "my-sft")
    res, _ = synth("--model", str(bare), "--codec-dir", str(layouts["extra"]), "--speaker", "speaker_test",
                   "--text", "Hello.", "--max-new-tokens", "3", "--out", str(tmp_path / "o.wav"), "--device", "cpu",
                   "--dtype", "fp32", cwd=tmp_path)
    assert res["frames"] == 3 and res["codec_origin"] == "chosen"
    assert res["codec_dir"] == str(layouts["extra"] / "speech_tokenizer")


def test_standalone_codec_download_is_borrowed(layouts, tmp_path):
    """The codec published on its own (Qwen/Qwen3-TTS-Tokenizer-12Hz: the speech_tokenizer/ files at the top)
    next to a folder without one is found too."""
    parent = tmp_path / "models"
    bare = without_codec(layouts["sft"], parent / "my-sft")
    shutil.copytree(layouts["extra"] / "speech_tokenizer", parent / "Qwen3-TTS-Tokenizer-12Hz")
    engine, res = ours(bare, "speaker_test")
    assert engine.info.codec_origin == "sibling"
    assert engine.info.codec_dir == str((parent / "Qwen3-TTS-Tokenizer-12Hz").resolve())
    _, own = ours(layouts["sft"], "speaker_test")
    assert torch.equal(res.audio, own.audio)
