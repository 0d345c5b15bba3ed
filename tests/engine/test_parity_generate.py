"""End-to-end parity with the official qwen-tts 0.1.1 on tiny random checkpoints (CPU, fp32, greedy).

The oracle's public generate_* API is called as a user would; the codes it hands to its codec are
captured so codes can be compared, and its waveforms are compared with ours. Upstream's
max_new_tokens=N yields N-1 frames (QWEN3_TTS_FACTS.md §2), so it gets n+1 for our n.
"""
import numpy as np
import pytest
import torch

from engine import Engine, Request
from tests.support.decoding import oracle_greedy


FRAMES = 10
WAV_TOL = 1e-4


@pytest.fixture(scope="module")
def oracle_models(tiny_checkpoints, qwen_tts):
    models = {}
    for kind, path in tiny_checkpoints.items():
        models[kind] = qwen_tts.Qwen3TTSModel.from_pretrained(str(path), device_map="cpu", dtype=torch.float32)
    return models


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    return {kind: Engine.load(path, device="cpu", dtype="fp32") for kind, path in tiny_checkpoints.items()}


def run_oracle(model, method, **kwargs):
    """Call an oracle generate_* method greedily; return (codes list [frames, 16], wavs list)."""
    return oracle_greedy(model, method, FRAMES, **kwargs)


def run_ours(engine, req):
    params = engine.defaults.greedy().replace(max_new_tokens=FRAMES)
    return engine.generate(req, params=params)


def assert_same(ours, oracle_codes, oracle_wavs, ref_frames=0):
    assert len(oracle_codes) == 1
    codes = oracle_codes[0][ref_frames:].to(torch.long)
    assert ours.codes[0].shape == codes.shape, (ours.codes[0].shape, codes.shape)
    assert torch.equal(ours.codes[0], codes)
    mine = ours.audio[0, : ours.lengths[0]].numpy()
    theirs = np.asarray(oracle_wavs[0], dtype=np.float32)
    # Upstream cuts ICL reference audio with a float formula that sometimes keeps one extra sample.
    assert 0 <= len(theirs) - len(mine) <= 1
    theirs = theirs[len(theirs) - len(mine):]
    diff = float(np.abs(mine - theirs).max())
    assert diff <= WAV_TOL, diff
    return diff


CUSTOM_CASES = [
    ("Hello world.", "Auto", "ryan", None, True),
    ("The quick brown fox jumps over the lazy dog!", "English", "vivian", "Speak happily.", True),
    ("The quick brown fox jumps over the lazy dog!", "English", "aiden", None, False),
    ("你好，世界。今天天气很好。", "Chinese", "eric", None, True),  # dialect speaker: chinese -> sichuan
    ("Ça va? Très bien, merci.", "French", "sohee", "Whisper.", False),
    ("Numbers 1 2 3 and symbols #@!", "Auto", "dylan", "", True),  # dialect speaker with auto
]


@pytest.mark.parametrize("text,language,speaker,instruct,non_streaming", CUSTOM_CASES)
def test_custom_voice_parity(oracle_models, engines, text, language, speaker, instruct, non_streaming):
    codes, wavs = run_oracle(oracle_models["custom_voice"], "generate_custom_voice", text=text, language=language,
                             speaker=speaker, instruct=instruct, non_streaming_mode=non_streaming)
    ours = run_ours(engines["custom_voice"], Request(mode="custom", text=text, language=language, speaker=speaker,
                                                     instruct=instruct, non_streaming_mode=non_streaming))
    assert_same(ours, codes, wavs)


@pytest.mark.parametrize("instruct,non_streaming", [("A deep, calm male voice.", True), ("Bright and fast.", False),
                                                    ("", True)])
def test_voice_design_parity(oracle_models, engines, instruct, non_streaming):
    text = "Design a voice for this sentence."
    codes, wavs = run_oracle(oracle_models["voice_design"], "generate_voice_design", text=text, language="English",
                             instruct=instruct, non_streaming_mode=non_streaming)
    ours = run_ours(engines["voice_design"], Request(mode="design", text=text, language="English",
                                                     instruct=instruct, non_streaming_mode=non_streaming))
    assert_same(ours, codes, wavs)


def reference_audio(seconds=2.0, sr=24000):
    t = np.arange(int(seconds * sr)) / sr
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 657 * t + 0.3)
    rng = np.random.default_rng(0)
    return (wav + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


@pytest.mark.parametrize("icl", [False, True])
@pytest.mark.parametrize("non_streaming", [False, True])
def test_voice_clone_parity(oracle_models, engines, icl, non_streaming):
    ref = reference_audio()
    ref_text = "This is the reference speech." if icl else None
    oracle = oracle_models["base"]
    items = oracle.create_voice_clone_prompt(ref_audio=(ref, 24000), ref_text=ref_text, x_vector_only_mode=not icl)
    voice = engines["base"].extract_voice(ref, 24000, ref_text=ref_text)
    assert torch.allclose(voice.spk_embedding.float(), items[0].ref_spk_embedding.float(), atol=1e-5)
    if icl:
        assert torch.equal(voice.ref_codes, items[0].ref_code.to(torch.long))
    text = "Clone this voice, please."
    codes, wavs = run_oracle(oracle, "generate_voice_clone", text=text, language="English",
                             voice_clone_prompt=items, non_streaming_mode=non_streaming)
    ours = run_ours(engines["base"], Request(mode="clone", text=text, language="English", voice=voice,
                                             non_streaming_mode=non_streaming))
    ref_frames = voice.ref_codes.shape[0] if icl else 0
    assert_same(ours, codes, wavs, ref_frames=ref_frames)


def test_eos_ends_generation_like_upstream(qwen_tts, eos_checkpoint):
    """On a checkpoint whose EOS row is live, both engines stop at the same frame."""
    oracle = qwen_tts.Qwen3TTSModel.from_pretrained(str(eos_checkpoint), device_map="cpu", dtype=torch.float32)
    engine = Engine.load(eos_checkpoint, device="cpu", dtype="fp32")
    stopped = 0
    for i, speaker in enumerate(["ryan", "vivian", "serena", "uncle_fu", "ono_anna", "aiden"]):
        text = f"Sentence number {i} for the end of speech test."
        codes, wavs = run_oracle(oracle, "generate_custom_voice", text=text, language="English", speaker=speaker)
        ours = run_ours(engine, Request(mode="custom", text=text, language="English", speaker=speaker))
        assert_same(ours, codes, wavs)
        stopped += ours.codes[0].shape[0] < FRAMES
    assert stopped >= 1, "no case reached EOS; the test checkpoint should make EOS likely"


def test_default_non_streaming_mode_is_the_official_one(qwen_tts):
    """Request(non_streaming_mode=None) and the CLI without --non-streaming-mode use the official default."""
    import inspect

    from engine.prompt import DEFAULT_NON_STREAMING

    methods = {"custom": "generate_custom_voice", "design": "generate_voice_design", "clone": "generate_voice_clone"}
    official = {mode: inspect.signature(getattr(qwen_tts.Qwen3TTSModel, name)).parameters["non_streaming_mode"].default
                for mode, name in methods.items()}
    assert DEFAULT_NON_STREAMING == official
