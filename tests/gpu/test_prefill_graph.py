"""Prefill CUDA graphs in length buckets and load-time capture (skipped without CUDA).

A bucketed prefill pads the prompt at the end; under the causal mask the real rows cannot see the
padding, so greedy codes must equal those after an exact-length eager prefill, frame for frame (fp32),
in every mode. bf16: the padded matmuls may round differently, so the check is structural (shapes,
ranges) plus the prefill hidden state within bf16 rounding of the exact-length one.
"""
import pytest
import torch

from engine import Engine, Request, Voice
from engine.slots import prefill_into
from engine.gpu.codec_graph import pieces
from tests.support.decoding import decode_codes

pytestmark = pytest.mark.gpu

FRAMES = 100


def _load(path, dtype, triton="off"):
    return Engine.load(path, device="cuda", dtype=dtype, cuda_graphs="on", triton=triton, max_seq_len=512)


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    loaded = {}

    def get(model_type, dtype, triton="off"):
        if (model_type, dtype, triton) not in loaded:
            loaded[model_type, dtype, triton] = _load(tiny_checkpoints[model_type], dtype, triton)
        return loaded[model_type, dtype, triton]

    yield get
    for e in loaded.values():
        e.release()


def _voice(engine, icl):
    g = torch.Generator().manual_seed(3)
    return Voice(spk_embedding=0.1 * torch.randn(engine.cfg.embedding_width, generator=g),
                 model_size=engine.cfg.tts_model_size,
                 ref_codes=torch.randint(0, 2048, (40, 16), generator=g) if icl else None,
                 ref_text="The reference says these words." if icl else None)


CASES = {  # mode -> (checkpoint, request builder)
    "custom": ("custom_voice", lambda e: Request(mode="custom", text="Bucketed prefill, exact codes.",
                                                  language="English", speaker="ryan", instruct="")),
    "design": ("voice_design", lambda e: Request(mode="design", text="Bucketed prefill, exact codes.",
                                                  language="English", instruct="A calm, low voice.")),
    "clone_xvector": ("base", lambda e: Request(mode="clone", text="Bucketed prefill, exact codes.",
                                                 language="English", voice=_voice(e, False))),
    "clone_icl": ("base", lambda e: Request(mode="clone", text="Bucketed prefill, exact codes.",
                                             language="English", voice=_voice(e, True))),
}


def _exact_length(engine):
    """Context: the runner prefills eagerly at the prompt's exact length (its prefill graphs set aside)."""
    class Off:
        def __enter__(self):
            self.saved, engine.runner.prefill_graphs = engine.runner.prefill_graphs, None

        def __exit__(self, *exc):
            engine.runner.prefill_graphs = self.saved
    return Off()


@pytest.mark.parametrize("mode,takes,triton", [(m, t, "off") for m in CASES for t in (1, 3)]
                         + [(m, 1, "on") for m in ("custom", "clone_icl")])
def test_fp32_bucketed_prefill_equals_exact_length(engines, mode, takes, triton):
    """The graphs run the fused prefill (kernels as torch references, or as Triton); the exact-length
    prefill is the module's own forward."""
    ckpt, build = CASES[mode]
    engine = engines(ckpt, "fp32", triton)
    req = build(engine)
    pre = engine.runner.prefill_graphs
    length = engine.builder.build(req).prefill.shape[1]
    assert pre.bucket(length) > length, "the prompt must be padded for this test to mean anything"
    params = engine.defaults.greedy().replace(max_new_tokens=FRAMES)
    before = pre.replays
    bucketed, _ = decode_codes(engine, engine.runner, req, takes, params)
    assert pre.replays == before + 1
    with _exact_length(engine):
        exact, _ = decode_codes(engine, engine.runner, req, takes, params)
    assert bucketed.shape == (takes, FRAMES, 16)
    assert torch.equal(bucketed.cpu(), exact.cpu()), mode


@pytest.mark.parametrize("mode", list(CASES))
def test_bf16_bucketed_prefill_structure(engines, mode):
    ckpt, build = CASES[mode]
    engine = engines(ckpt, "bf16")
    req = build(engine)
    prompt = engine.builder.build(req)
    with torch.inference_mode():
        hidden = engine.runner.prefill_graphs.run(prompt, engine.talker.new_cache(2, 512), [1]).float()
        exact = prefill_into(engine.talker, prompt, engine.talker.new_cache(2, 512), [1]).float()
    rel = ((hidden - exact).norm() / exact.norm()).item()
    print(f"{mode}: bf16 bucketed vs exact prefill hidden, relative error {rel:.2e}")
    assert torch.isfinite(hidden).all() and rel < 2e-2
    params = engine.defaults.replace(max_new_tokens=40)
    res = engine.generate(req, takes=2, seed=1, params=params)
    for codes in res.codes:
        assert codes.shape == (40, 16) and int(codes.min()) >= 0 and int(codes.max()) < 2048
    assert torch.isfinite(res.audio).all() and res.audio.abs().max() > 0


@pytest.mark.parametrize("triton", ["off", "on"])
def test_bf16_prefill_graph_replays_fused_prefill(engines, triton):
    """A bucket's graph computes what FusedStack.prefill computes run op by op on the same padded input
    (bf16, kernels as torch references or as Triton): the same kernels on the same shapes, so equal up to
    a library picking another algorithm under capture (printed; the bound is bf16 rounding)."""
    engine = engines("custom_voice", "bf16", triton)
    pre = engine.runner.prefill_graphs
    prompt = engine.builder.build(CASES["custom"][1](engine))
    length = prompt.prefill.shape[1]
    b = pre.bucket(length)
    with torch.inference_mode():
        hidden = pre.run(prompt, pre.cache, [0])
        k0 = pre.cache.k[-1][:, :, :length].clone()
        x = torch.zeros_like(pre.x[:, :b])
        x[:, :length] = prompt.prefill
        cache = engine.talker.new_cache(1, b)
        want = pre.fused.prefill(x, cache, (pre.rope[0][:b], pre.rope[1][:b]))[:, length - 1]
    k_want = cache.k[-1][:, :, :length]
    print(f"triton {triton}: graph vs op by op, hidden max diff {(hidden - want).abs().max().item():.3g}, "
          f"K max diff {(k0 - k_want).abs().max().item():.3g}")
    torch.testing.assert_close(hidden, want, atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(k0, k_want, atol=1.6e-2, rtol=1.6e-2)


def test_no_capture_while_requests_run(engines):
    """After load, requests of new prompt lengths, frame counts and chunk sizes replay only: the prefill
    buckets, the one-take frame windows and every codec piece were captured at load."""
    engine = engines("custom_voice", "fp32")
    runner, codec = engine.runner, engine.codec_graphs
    assert runner.prefill_graphs.cache is runner.states[1].cache  # one take: prefilled in place, no copy
    frames_before, codec_before, late_before = len(runner.graphs), codec.captures, runner.late_captures
    texts = ["Hi.", "A somewhat longer sentence than the first one, with a comma.",
             "And now a third sentence, longer again, so that its prompt lands in yet another bucket of the "
             "prefill graphs, which were all captured when the model was loaded."]
    replays = runner.prefill_graphs.replays
    for i, text in enumerate(texts):
        req = Request(mode="custom", text=text, language="English", speaker="ryan")
        params = engine.defaults.replace(max_new_tokens=[7, 61, 300][i])
        engine.generate(req, seed=i, params=params)
        for chunk in (1, 2, 3, 12):
            n = sum(c.codes.shape[0] for c in engine.stream(req, seed=i, params=params.replace(max_new_tokens=13),
                                                            chunk_frames=chunk, first_chunk_frames=1))
            assert n == 13
    assert runner.prefill_graphs.replays == replays + len(texts) * 5
    assert runner.late_captures == late_before and len(runner.graphs) == frames_before
    assert codec.late_captures == 0 and codec.captures == codec_before and codec.eager_pieces == 0
    notes = " ".join(engine.info.notes)
    assert "prefill graphs" in notes and "static buffers take" in notes, notes


def test_first_chunk_smaller_stream_equals_generate(engines):
    engine = engines("custom_voice", "fp32")
    req = Request(mode="custom", text="First audio comes after two frames.", language="English", speaker="ryan")
    params = engine.defaults.replace(max_new_tokens=30)
    whole = engine.generate(req, seed=9, params=params)
    chunks = list(engine.stream(req, seed=9, params=params, chunk_frames=8, first_chunk_frames=2))
    assert [c.codes.shape[0] for c in chunks] == [2, 8, 8, 8, 4]
    joined = torch.cat([c.audio for c in chunks])
    assert float((joined - whole.audio[0]).abs().max()) <= 1e-5
    assert len(pieces(2)) == 1


def test_icl_reference_decoded_once(engines):
    engine = engines("base", "fp32")
    voice = _voice(engine, True)
    req = Request(mode="clone", text="The reference prefix is decoded once.", language="English", voice=voice)
    params = engine.defaults.replace(max_new_tokens=16)
    g = engine.codec_graphs
    hits = g.prefix_hits
    first = engine.generate(req, seed=2, params=params)
    second = engine.generate(req, seed=2, params=params)
    assert g.prefix_hits >= hits + 1
    assert torch.equal(first.audio, second.audio)
