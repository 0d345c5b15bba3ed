"""Voice blending (engine/voice_blend.py): the mix, its errors, and a blended voice driving a tiny Base model."""
import pytest
import torch

from engine import Engine, Request, Voice
from engine.errors import InvalidInputError, VoiceError
from engine.voice_blend import blend_voices


def voice(seed, size="0b6", width=1024, icl=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2048, (5, 16), generator=g) if icl else None
    return Voice(spk_embedding=torch.randn(width, generator=g).to(dtype), model_size=size, ref_codes=codes,
                 ref_text="Reference words." if icl else None)


def test_weighted_mix_keeps_the_mean_norm():
    a, b = voice(1), voice(2)
    out = blend_voices([a, b], [3.0, 1.0])
    ea, eb = a.spk_embedding, b.spk_embedding
    mix = 0.75 * ea + 0.25 * eb
    expected = mix * (0.75 * ea.norm() + 0.25 * eb.norm()) / mix.norm()
    assert torch.allclose(out.spk_embedding, expected, atol=1e-5)
    assert out.model_size == "0b6" and out.family == a.family and not out.is_icl
    assert torch.allclose(blend_voices([a, b], [1.0, 0.0]).spk_embedding, ea, atol=1e-5)  # weight 0 drops a voice
    assert torch.allclose(blend_voices([a, b, voice(3)], [2, 2, 0]).spk_embedding,
                          blend_voices([a, b], [0.5, 0.5]).spk_embedding, atol=1e-6)  # weights are relative


def test_icl_voices_blend_their_x_vectors_only():
    a, b = voice(1, icl=True), voice(2)
    out = blend_voices([a, b], [1, 1])
    assert not out.is_icl and out.ref_text is None
    plain = Voice(spk_embedding=a.spk_embedding, model_size="0b6")
    assert torch.equal(out.spk_embedding, blend_voices([plain, b], [1, 1]).spk_embedding)


def test_dtype_follows_the_first_voice():
    out = blend_voices([voice(1, dtype=torch.bfloat16), voice(2)], [1, 1])
    assert out.spk_embedding.dtype == torch.bfloat16


@pytest.mark.parametrize("voices, weights, err, words", [
    ([voice(1)], [1], InvalidInputError, "2 to 4 voices"),
    ([voice(i) for i in range(5)], [1] * 5, InvalidInputError, "2 to 4 voices"),
    ([voice(1), voice(2)], [1], InvalidInputError, "but 1 weights"),
    ([voice(1), voice(2)], [1, -0.5], InvalidInputError, "0 or more"),
    ([voice(1), voice(2)], [0, 0], InvalidInputError, "add up to at least"),
    ([voice(1), voice(2, size="1b7", width=2048)], [1, 1], VoiceError, "voice 2 was made by a qwen3-tts-12hz 1b7"),
    ([voice(1), voice(2, size="1b7")], [1, 1], VoiceError, "same model family and size"),
])
def test_blend_errors(voices, weights, err, words):
    with pytest.raises(err, match=words):
        blend_voices(voices, weights)


def test_other_family_is_refused():
    other = voice(2)
    other.family = "someone-else"
    with pytest.raises(VoiceError, match="someone-else"):
        blend_voices([voice(1), other], [1, 1])


def test_opposite_voices_that_cancel_are_refused():
    a = voice(1)
    with pytest.raises(InvalidInputError, match="cancel"):
        blend_voices([a, Voice(spk_embedding=-a.spk_embedding, model_size="0b6")], [1, 1])


def test_blended_voice_saves_loads_and_clones(tiny_checkpoints, tmp_path):
    eng = Engine.load(tiny_checkpoints["base"], device="cpu", dtype="fp32")
    wav = torch.randn(2, 24000, generator=torch.Generator().manual_seed(0)) * 0.1
    a = eng.extract_voice(wav[0], 24000)
    b = eng.extract_voice(wav[1], 24000, ref_text="Some reference words.")
    mixed = blend_voices([a, b], [0.3, 0.7])
    path = mixed.save(tmp_path / "mixed.safetensors")
    loaded = Voice.load(path)
    eng.check_voice(loaded)
    assert torch.equal(loaded.spk_embedding, mixed.spk_embedding)
    params = eng.defaults.replace(max_new_tokens=3)
    res = eng.generate(Request(mode="clone", text="Blended.", language="English", voice=loaded), params=params)
    assert res.lengths == [3 * 1920] and torch.isfinite(res.audio).all()
    small = Voice(spk_embedding=torch.zeros(8), model_size="other")
    with pytest.raises(VoiceError):
        blend_voices([loaded, small], [1, 1])


def test_errors_use_the_given_labels():
    with pytest.raises(VoiceError, match="voice_4 was made by .* but voice_1 by"):
        blend_voices([voice(1), voice(2, size="1b7")], [1, 1], labels=["voice_1", "voice_4"])
