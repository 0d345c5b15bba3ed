"""Bad input gets a typed error that says what to do; nothing crashes and the engine stays usable."""
import re

import numpy as np
import pytest
import torch

from engine import Engine, Request, Voice
from engine.errors import (CheckpointError, InvalidInputError, ModeError, PromptTooLongError, Qwen3TTSError,
                           VoiceError)


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    return {k: Engine.load(p, device="cpu", dtype="fp32") for k, p in tiny_checkpoints.items()}


def params(engine, n=3):
    return engine.defaults.replace(max_new_tokens=n)


def custom(text="Fine.", **kw):
    base = dict(mode="custom", text=text, language="English", speaker="ryan")
    base.update(kw)
    return Request(**base)


@pytest.mark.parametrize("text", ["", "   ", "\n\t ", None])
def test_empty_text(engines, text):
    with pytest.raises(InvalidInputError, match="text is empty"):
        engines["custom_voice"].generate(custom(text), params=params(engines["custom_voice"]))


def test_unknown_speaker_lists_the_speakers(engines):
    with pytest.raises(InvalidInputError, match="unknown speaker 'bob'.*ryan"):
        engines["custom_voice"].generate(custom(speaker="bob"))


def test_unknown_language_lists_the_languages(engines):
    with pytest.raises(InvalidInputError, match="unknown language 'Klingon'.*English"):
        engines["custom_voice"].generate(custom(language="Klingon"))
    with pytest.raises(InvalidInputError):  # dialects are picked through speakers, not asked for directly
        engines["custom_voice"].generate(custom(language="sichuan_dialect"))


def test_language_is_case_insensitive(engines):
    e = engines["custom_voice"]
    a = e.generate(custom(language="ENGLISH"), params=params(e).greedy())
    b = e.generate(custom(language="english"), params=params(e).greedy())
    assert torch.equal(a.codes[0], b.codes[0])


def test_clone_on_non_base_model(engines):
    for kind in ("custom_voice", "voice_design"):
        with pytest.raises(ModeError, match="VoiceClone|Base"):
            engines[kind].generate(Request(mode="clone", text="Hi.", voice=None))
        with pytest.raises(ModeError, match="Base"):
            engines[kind].extract_voice(np.zeros(24000, np.float32) + 0.1, 24000)


def test_design_on_non_voice_design_model(engines):
    for kind in ("custom_voice", "base"):
        with pytest.raises(ModeError, match="VoiceDesign"):
            engines[kind].generate(Request(mode="design", text="Hi.", instruct="calm"))


def test_custom_on_base_names_the_right_mode(engines):
    """The engine speaks of modes and checkpoints; the nodes and the CLI name their own node or option."""
    with pytest.raises(ModeError, match="Use mode 'clone' with it, or load a CustomVoice checkpoint") as exc:
        engines["base"].generate(custom())
    assert "node" not in str(exc.value)


@pytest.mark.parametrize("value,lo,hi,says", [(0, 1, 1, "takes must be exactly 1 (got 0)"),
                                              (2, 1, 1, "takes must be exactly 1 (got 2)"),
                                              (0, 1, 16, "takes must be between 1 and 16 (got 0)")])
def test_range_messages_state_the_real_range(value, lo, hi, says):
    from engine import checks

    with pytest.raises(InvalidInputError, match=f"^{re.escape(says)}"):
        checks.whole_number("takes", value, lo, hi)


@pytest.mark.parametrize("wave,reason", [
    (np.full(12000, 0.2, np.float32), "shorter than 1"),
    (np.zeros(48000, np.float32), "silent"),
    (np.where(np.arange(48000) == 100, np.nan, 0.2).astype(np.float32), "NaN"),
])
def test_bad_reference_audio(engines, wave, reason):
    with pytest.raises(InvalidInputError, match=reason):
        engines["base"].extract_voice(wave, 24000)


def _wav(path, samples: np.ndarray, sr: int, float32: bool = False):
    """A mono WAV file whose header says `sr` Hz (wave refuses odd rates and float data)."""
    from tests.engine.test_audio import _write_raw_wav

    payload = samples.astype("<f4" if float32 else "<i2").tobytes()
    _write_raw_wav(path, payload, 1, sr, 32 if float32 else 16, tag=3 if float32 else 1)
    return path


@pytest.mark.parametrize("name,samples,sr,float32,reason", [
    ("empty", np.zeros(0), 24000, False, "empty"),
    ("nan", np.where(np.arange(48000) == 7, np.nan, 0.2), 24000, True, "NaN"),
    ("one_hertz", np.full(10, 3000), 1, False, "invalid sample rate"),
    ("giga_hertz", np.full(48000, 3000), 2_000_000_000, False, "invalid sample rate"),
])
def test_bad_reference_files(engines, tmp_path, name, samples, sr, float32, reason):
    """Files that soxr could not resample (or should not) are a ReferenceAudioError, never a crash."""
    from engine.audio import load_wav
    from engine.errors import ReferenceAudioError

    x, rate = load_wav(_wav(tmp_path / f"{name}.wav", samples, sr, float32))
    with pytest.raises(ReferenceAudioError, match=reason):
        engines["base"].extract_voice(x, rate, ref_text="Some words.")


def test_max_new_tokens_must_be_positive(engines):
    e = engines["custom_voice"]
    for n in (0, -5):
        with pytest.raises(InvalidInputError, match="max_new_tokens"):
            e.generate(custom(), params=e.defaults.replace(max_new_tokens=n))


def test_prompt_longer_than_cache(tiny_checkpoints):
    small = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=32)
    with pytest.raises(PromptTooLongError, match="max_seq_len"):
        small.generate(custom("word " * 200))


def test_takes_out_of_range(engines):
    e = engines["custom_voice"]
    with pytest.raises(InvalidInputError, match="takes"):
        e.generate(custom(), takes=0)
    with pytest.raises(InvalidInputError, match="takes"):
        e.generate(custom(), takes=e.max_takes + 1)


@pytest.mark.parametrize("max_takes,warm_takes", [(2, 3), (4, 0), (4, 2.5), (4, True)])
def test_load_refuses_a_warm_takes_outside_max_takes(tiny_checkpoints, max_takes, warm_takes):
    with pytest.raises(InvalidInputError, match="warm_takes"):
        Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_takes=max_takes,
                    warm_takes=warm_takes)


def test_first_take_beyond_the_stream_range(engines):
    e = engines["custom_voice"]
    with pytest.raises(InvalidInputError, match="take indices end at 4294967295"):
        e.generate(custom(), takes=2, first_take=2**32 - 1, params=params(e))
    with pytest.raises(InvalidInputError, match="first_take must be 0 or more"):
        next(e.stream(custom(), first_take=-1, params=params(e)))
    last = e.generate(custom(), takes=1, first_take=2**32 - 1, params=params(e))  # the last stream is usable
    assert last.codes[0].shape == (3, 16)


def test_voice_from_another_model_size(engines, tmp_path):
    e = engines["base"]
    alien = Voice(spk_embedding=torch.zeros(2048, dtype=torch.bfloat16), model_size="1b7")
    alien.save(tmp_path / "big.safetensors")
    loaded = Voice.load(tmp_path / "big.safetensors")
    with pytest.raises(VoiceError, match="1b7.*extract the voice again"):
        e.generate(Request(mode="clone", text="Hi.", voice=loaded))


def test_voice_round_trip_and_size(engines, tmp_path):
    e = engines["base"]
    t = np.arange(24000 * 2) / 24000
    v = e.extract_voice((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000, ref_text="Hello there.")
    path = v.save(tmp_path / "v.safetensors")
    back = Voice.load(path)
    assert torch.equal(back.spk_embedding, v.spk_embedding) and torch.equal(back.ref_codes, v.ref_codes)
    assert back.ref_text == "Hello there." and back.model_size == v.model_size
    xvec = Voice(spk_embedding=torch.zeros(2048, dtype=torch.bfloat16), model_size="1b7")
    size = xvec.save(tmp_path / "x.safetensors").stat().st_size
    assert 4096 <= size < 4096 + 512  # 4 KB of bf16 data plus a small header


def test_corrupted_or_foreign_voice_files(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 10)
    with pytest.raises(VoiceError, match="corrupted|not a"):
        Voice.load(bad)
    good = Voice(spk_embedding=torch.zeros(32), model_size="tiny").save(tmp_path / "good.safetensors")
    truncated = tmp_path / "trunc.safetensors"
    truncated.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(VoiceError):
        Voice.load(truncated)
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(3)}, str(foreign))
    with pytest.raises(VoiceError, match="not a Qwen3-TTS Fast voice"):
        Voice.load(foreign)


def test_corrupted_or_truncated_checkpoint(tiny_checkpoints, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoints["custom_voice"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        Engine.load(broken, device="cpu", dtype="fp32")
    (broken / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        Engine.load(broken, device="cpu", dtype="fp32")


def test_engine_usable_after_errors(engines):
    e = engines["custom_voice"]
    for bad in (custom(""), custom(speaker="nobody"), custom(language="xx")):
        with pytest.raises(Qwen3TTSError):
            e.generate(bad)
    assert e.generate(custom(), params=params(e)).codes[0].shape == (3, 16)
