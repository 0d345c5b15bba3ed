"""Engine behaviour on tiny random checkpoints: takes, reproducibility, streaming, structure."""
import numpy as np
import pytest
import torch

from engine import Engine, Request
from engine.errors import InvalidInputError
from tests.support.decoding import joined_take

FRAMES = 12


@pytest.fixture(scope="module")
def custom(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def base(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["base"], device="cpu", dtype="fp32")


def req(text="One decode loop serves every mode.", **kw):
    return Request(mode="custom", text=text, language="English", speaker="ryan", **kw)


def sampled(engine, frames=FRAMES):
    return engine.defaults.replace(max_new_tokens=frames)


def test_takes_in_a_batch_equal_takes_alone(custom):
    batch = custom.generate(req(), takes=4, seed=11, params=sampled(custom))
    assert batch.audio.shape == (4, FRAMES * 1920)
    for i in range(4):
        alone = custom.generate(req(), takes=1, seed=11, first_take=i, params=sampled(custom))
        assert torch.equal(alone.codes[0], batch.codes[i]), f"take {i}"
        assert torch.allclose(alone.audio[0], batch.audio[i], atol=1e-5)
    assert not torch.equal(batch.codes[0], batch.codes[1]), "takes must differ"


def test_same_seed_same_output_and_other_seed_differs(custom):
    a = custom.generate(req(), takes=2, seed=5, params=sampled(custom))
    b = custom.generate(req(), takes=2, seed=5, params=sampled(custom))
    c = custom.generate(req(), takes=2, seed=6, params=sampled(custom))
    assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes))
    assert torch.equal(a.audio, b.audio)
    assert not torch.equal(a.codes[0], c.codes[0])


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_streaming_equals_generate(custom, chunk):
    params = sampled(custom, 15)
    whole = custom.generate(req(), takes=2, seed=3, params=params)
    chunks = list(custom.stream(req(), takes=2, seed=3, params=params, chunk_frames=chunk))
    for i in range(2):
        mine = [c for c in chunks if c.take == i]
        assert [c.index for c in mine] == list(range(len(mine)))
        assert mine[-1].final and not any(c.final for c in mine[:-1])
    for i in range(2):
        joined = joined_take(chunks, i)
        assert joined.shape[0] == whole.lengths[i]
        assert float((joined - whole.audio[i, : whole.lengths[i]]).abs().max()) <= 1e-5


def test_smaller_first_chunk_same_audio(custom):
    params = sampled(custom, 15)
    whole = custom.generate(req(), takes=2, seed=3, params=params)
    chunks = list(custom.stream(req(), takes=2, seed=3, params=params, chunk_frames=4, first_chunk_frames=2))
    assert [c.codes.shape[0] for c in chunks if c.take == 0] == [2, 4, 4, 4, 1]
    for i in range(2):
        joined = joined_take(chunks, i)
        assert float((joined - whole.audio[i, : whole.lengths[i]]).abs().max()) <= 1e-5
    with pytest.raises(InvalidInputError, match="first_chunk_frames"):
        next(custom.stream(req(), params=params, chunk_frames=4, first_chunk_frames=5))


def test_streaming_icl_clone_equals_generate(base):
    t = np.arange(2 * 24000) / 24000
    voice = base.extract_voice((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 24000, ref_text="Reference.")
    r = Request(mode="clone", text="Streaming a cloned voice.", language="English", voice=voice)
    params = sampled(base, 9)
    whole = base.generate(r, seed=1, params=params)
    joined = joined_take(base.stream(r, seed=1, params=params, chunk_frames=4), 0)
    assert float((joined - whole.audio[0]).abs().max()) <= 1e-5


def test_structure_of_sampled_codes(custom):
    res = custom.generate(req(), takes=3, seed=0, params=sampled(custom, 20))
    for codes in res.codes:
        assert codes.shape == (20, 16)
        assert codes.dtype == torch.long
        assert (codes >= 0).all() and (codes < 2048).all()  # codebook 0 never a control id
    assert torch.isfinite(res.audio).all() and res.audio.abs().max() <= 1.0


def test_greedy_ignores_seed(custom):
    p = custom.defaults.greedy().replace(max_new_tokens=6)
    a = custom.generate(req(), seed=1, params=p)
    b = custom.generate(req(), seed=2, params=p)
    assert torch.equal(a.codes[0], b.codes[0])


def test_progress_and_stop(custom):
    seen = []
    custom.generate(req(), params=sampled(custom, 10), on_progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == 10 and all(t == 10 for _, t in seen)
    from engine.errors import GenerationInterrupted

    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(GenerationInterrupted):
        custom.generate(req(), params=sampled(custom, 10), should_stop=stop)
    # the engine stays usable after an interruption
    assert custom.generate(req(), params=sampled(custom, 3)).codes[0].shape == (3, 16)


def test_info_reports_what_ran(custom):
    info = custom.info
    assert info.device == "cpu" and info.dtype == "float32" and info.cuda_graphs is False
    assert info.kernels == []
    assert "custom_voice" in info.summary()


def test_fp16_and_bf16_run_on_cpu(tiny_checkpoints):
    for dtype in ("fp16", "bf16"):
        e = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype=dtype)
        res = e.generate(req(), takes=2, params=sampled(e, 5))
        assert e.info.dtype == {"fp16": "float16", "bf16": "bfloat16"}[dtype]
        assert res.audio.dtype == torch.float32 and torch.isfinite(res.audio).all()
        assert all(c.shape == (5, 16) for c in res.codes)


def test_instruct_is_ignored_on_0b6_custom_voice_with_a_note(tiny_checkpoints, tmp_path, caplog):
    import json
    import shutil

    small = tmp_path / "as_0b6"
    shutil.copytree(tiny_checkpoints["custom_voice"], small)
    cfg = json.loads((small / "config.json").read_text())
    cfg["tts_model_size"] = "0b6"
    (small / "config.json").write_text(json.dumps(cfg))
    e = Engine.load(small, device="cpu", dtype="fp32")
    p = e.defaults.greedy().replace(max_new_tokens=5)
    with caplog.at_level("WARNING"):
        with_instruct = e.generate(req(instruct="Whisper softly."), params=p)
    without = e.generate(req(), params=p)
    assert torch.equal(with_instruct.codes[0], without.codes[0])
    assert any("instruct is ignored" in n for n in with_instruct.stats["notes"])
    assert "instruct is ignored" in caplog.text


def test_takes_that_end_early_stop_contributing_audio(eos_checkpoint):
    """Rows reach EOS at different frames: each take keeps only its own frames, streamed or not."""
    e = Engine.load(eos_checkpoint, device="cpu", dtype="fp32")
    params = e.defaults.replace(max_new_tokens=30)
    whole = e.generate(req(), takes=4, seed=21, params=params)
    frames = [n // 1920 for n in whole.lengths]
    assert min(frames) < 30 and len(set(frames)) > 1, frames  # some takes stop early, at different frames
    for i, n in enumerate(whole.lengths):
        assert whole.codes[i].shape[0] * 1920 == n
        assert (whole.codes[i][:, 0] < 2048).all()  # EOS itself is never a frame
        assert not whole.audio[i, n:].any()  # only zero padding after the end
    chunks = list(e.stream(req(), takes=4, seed=21, params=params, chunk_frames=4))
    for i in range(4):
        joined = joined_take(chunks, i)
        assert joined.shape[0] == whole.lengths[i]
        if joined.numel():
            assert float((joined - whole.audio[i, : whole.lengths[i]]).abs().max()) <= 1e-5
        assert all(c.audio.numel() == c.codes.shape[0] * 1920 for c in chunks if c.take == i)


@pytest.mark.parametrize("non_streaming", [False, True])
def test_prompt_fixed_pieces_are_made_once_and_change_nothing(custom, non_streaming):
    """The builder keeps the embeddings of fixed ids (markers, role, tags, speakers); prompts of new lengths add
    nothing to it, and every prompt equals one built from scratch by a builder that kept nothing."""
    from engine.prompt import PromptBuilder

    builder = custom.builder
    texts = ["Short.", "A somewhat longer line, with a few more words in it to speak.", "Short."]
    built = [builder.build(req(t, non_streaming_mode=non_streaming)) for t in texts[:1]]
    size = len(builder._fixed)
    built += [builder.build(req(t, non_streaming_mode=non_streaming)) for t in texts[1:]]
    assert len(builder._fixed) == size  # lengths do not grow it
    for text, prompt in zip(texts, built):
        fresh = PromptBuilder(builder.cfg, builder.talker, builder.tok)
        fresh = fresh.build(req(text, non_streaming_mode=non_streaming))
        assert torch.equal(prompt.prefill, fresh.prefill)
        assert torch.equal(prompt.trailing, fresh.trailing)
        assert torch.equal(prompt.pad_embed, fresh.pad_embed)


@pytest.mark.parametrize("streaming_text", [False, True])
def test_prompt_keeps_a_voice_reference_and_changes_nothing(base, tmp_path, streaming_text):
    """The builder keeps an ICL voice's reference (text ids and frame embeddings) by content: the same voice loaded
    again from its file embeds no frame, another voice does, and every prompt equals one built from scratch."""
    from engine.prompt import VOICES_KEPT, PromptBuilder
    from engine.voice import Voice

    t = np.arange(24000) / 24000
    voices = [base.extract_voice((0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32), 24000, ref_text=text)
              for f, text in ((200, "Reference."), (330, "Another one."))]
    voices[0].save(tmp_path / "v.safetensors")
    voices.append(Voice.load(tmp_path / "v.safetensors"))  # equal content, another object
    builder = PromptBuilder(base.cfg, base.talker, base.builder.tok)
    embedded = []
    real = builder.frame_embeddings
    builder.frame_embeddings = lambda codes: embedded.append(codes.shape[0]) or real(codes)

    def clone(voice, text):
        return Request(mode="clone", text=text, language="English", voice=voice, non_streaming_mode=streaming_text)

    texts = ["A line.", "A longer line, with a few more words in it to speak than the reference holds."]
    built = [(v, text, builder.build(clone(v, text))) for v in voices for text in texts]
    assert embedded == [v.ref_codes.shape[0] for v in voices[:2]] and len(builder._references) == 2 <= VOICES_KEPT
    for voice, text, prompt in built:
        fresh = PromptBuilder(base.cfg, base.talker, base.builder.tok).build(clone(voice, text))
        assert torch.equal(prompt.prefill, fresh.prefill) and torch.equal(prompt.trailing, fresh.trailing)
        assert torch.equal(prompt.ref_codes, voice.ref_codes)
    builder.forget()
    assert not builder._references


def test_engine_config_is_the_load_argument_and_a_cache_key(tiny_checkpoints, tmp_path):
    from engine import EngineConfig
    from engine.errors import UnsupportedConfigError

    path = tiny_checkpoints["custom_voice"]
    a = EngineConfig(model_dir=str(path), device="cpu", dtype="fp32")
    b = EngineConfig(model_dir=path, device="cpu", dtype="fp32")  # a Path, the same folder
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != a.replace(max_takes=2)
    with pytest.raises(AttributeError):
        a.max_takes = 3  # frozen
    e = Engine.load(a)
    assert e.config == a and e.max_takes == a.max_takes
    with pytest.raises(UnsupportedConfigError, match="triton"):
        Engine.load(a.replace(triton="maybe"))
    with pytest.raises(InvalidInputError, match="warm_takes"):
        Engine.load(a.replace(max_takes=2, warm_takes=3))


def test_one_request_or_a_list_and_nothing_else(custom):
    from engine import BatchItem

    params = sampled(custom, 4)
    with pytest.raises(InvalidInputError, match="set on each item"):
        custom.generate([BatchItem(req())], takes=2, params=params)
    with pytest.raises(InvalidInputError, match="a Request or a list of BatchItem"):
        custom.generate("Hello", params=params)
    with pytest.raises(InvalidInputError, match="a Request or a list of BatchItem"):
        next(custom.stream({"text": "Hello"}, params=params))
    assert custom.generate([], params=params) == [] and list(custom.stream([], params=params)) == []
    one = custom.generate(req(), takes=2, seed=4, params=params)
    listed = custom.generate([BatchItem(req(), takes=2, seed=4)], params=params)
    assert len(listed) == 1 and torch.equal(listed[0].audio, one.audio)


def test_kept_values_drop_the_least_recently_used_and_replace_their_own_key():
    from engine.kept import Kept

    kept = Kept(2)
    assert kept.put("a", 1) == 1 and kept.put("b", 2) == 2 and kept.get("missing") is None and kept.hits == 0
    assert kept.get("a") == 1 and kept.hits == 1  # "a" is now the most recently used
    kept.put("c", 3)
    assert "b" not in kept and kept.get("a") == 1 and len(kept) == 2
    kept.put("a", 10)  # its own entry replaced, nothing else dropped
    assert kept.get("a") == 10 and kept.get("c") == 3 and len(kept) == 2
    kept.clear()
    assert len(kept) == 0 and kept.get("a", "none") == "none"
