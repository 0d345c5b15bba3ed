"""Streaming codec decoder under CUDA graphs (skipped without CUDA).

The captured chunk step must replay the eager chunk step on the same DecodeState buffers, and both must
equal the one-pass decode. Tolerances: fp32 (TF32 off, see conftest.py) 1e-5, the bound the CPU tests
use for chunked vs one-pass decoding. bf16: graph and eager run the same kernels on the same inputs
(identical in practice; the bound only leaves room for a different library algorithm under capture),
while chunked vs one pass rounds differently in bf16 at every chunk boundary: on the CPU with the tiny
checkpoint codec that is up to ~0.009 max and ~3e-4 rms on output of rms ~0.2, so the bf16 bounds are
0.05 max and 5e-3 rms.
"""
import pytest
import torch

from engine import Engine, Request, Voice
from engine.codec import StreamingDecoder
from engine.errors import UnsupportedConfigError
from engine.gpu.codec_graph import WARM_CHUNKS, CodecGraphs
from tests.decoding import joined_take

pytestmark = pytest.mark.gpu

TOL = {"fp32": (1e-5, 1e-5), "bf16": (0.05, 5e-3)}  # (max abs, rms) of graph or stream vs one pass
REPLAY_TOL = {"fp32": 1e-5, "bf16": 0.02}  # max abs of graph vs eager stream


def _load(path, dtype, cuda_graphs="on"):
    return Engine.load(path, device="cuda", dtype=dtype, cuda_graphs=cuda_graphs, triton="off", max_seq_len=512)


@pytest.fixture(scope="module")
def fp32(tiny_checkpoints):
    return _load(tiny_checkpoints["custom_voice"], "fp32")


@pytest.fixture(scope="module")
def bf16(tiny_checkpoints):
    return _load(tiny_checkpoints["custom_voice"], "bf16")


def _codes(batch, frames, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (batch, frames, 16), generator=g).cuda()


def _stream(codec, codes, sizes, graphs=None, chunk=None):
    """Push codes [B, T, 16] in pieces of `sizes` frames; returns the joined audio (float32)."""
    assert sum(sizes) == codes.shape[1]
    dec = StreamingDecoder(codec, batch=codes.shape[0], graphs=graphs, chunk_frames=chunk)
    parts, s = [], 0
    for n in sizes:
        parts.append(dec.push(codes[:, s: s + n]))
        s += n
    return torch.cat(parts, dim=-1).float()


def _chunks(frames, chunk):
    return [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])


def _check(name, got, ref, dtype):
    diff = (got - ref).abs()
    worst, rms = diff.max().item(), diff.pow(2).mean().sqrt().item()
    print(f"{name} ({dtype}): max {worst:.3g}, rms {rms:.3g} (signal rms {ref.pow(2).mean().sqrt():.3f})")
    max_tol, rms_tol = TOL[dtype]
    assert worst <= max_tol and rms <= rms_tol, (name, worst, rms)


def test_load_precaptures_common_chunk_sizes(fp32):
    g = fp32.codec_graphs
    assert isinstance(g, CodecGraphs) and g.failure is None
    assert set(g.graphs) == {(1, k) for k in WARM_CHUNKS} and g.captures == len(WARM_CHUNKS)
    assert any(n.startswith("codec CUDA graphs: on") for n in fp32.info.notes), fp32.info.notes
    assert g.capture_seconds > 0
    # the capture warm-up decoded zeros on the shared state: it must have been put back to fresh
    assert all(not t.any() for t in g.states[1].buffers())


@pytest.mark.parametrize("dtype,batch,chunk", [("fp32", 1, 4), ("fp32", 2, 8), ("fp32", 3, 1), ("bf16", 1, 4),
                                               ("bf16", 2, 8)])
def test_graph_stream_equals_eager_and_one_pass(request, dtype, batch, chunk):
    engine = request.getfixturevalue(dtype)
    graphs = CodecGraphs(engine.codec.decoder)
    frames = 26
    codes = _codes(batch, frames, seed=batch * 10 + chunk)
    sizes = _chunks(frames, chunk)
    graphed = _stream(engine.codec, codes, sizes, graphs, chunk)
    eager = _stream(engine.codec, codes, sizes)
    one = engine.codec.decode(codes).float()
    assert graphed.shape == one.shape == (batch, frames * 1920)
    assert graphs.captures == 1 and set(graphs.graphs) == {(batch, chunk)}
    assert graphs.graphed_chunks == frames // chunk and graphs.eager_chunks == (1 if frames % chunk else 0)
    replay = (graphed - eager).abs().max().item()
    print(f"graph vs eager stream ({dtype}, batch {batch}, chunk {chunk}): max {replay:.3g}")
    assert replay <= REPLAY_TOL[dtype]
    _check(f"graph stream vs one pass, batch {batch}, chunk {chunk}", graphed, one, dtype)
    graphs.release()


def test_one_capture_per_chunk_size_across_utterances(fp32):
    graphs = CodecGraphs(fp32.codec.decoder)
    a, b = _codes(1, 20, seed=1), _codes(1, 20, seed=2)
    stream = StreamingDecoder(fp32.codec, batch=1, graphs=graphs, chunk_frames=4)
    state = graphs.states[1]
    ptrs = [t.data_ptr() for t in state.buffers()]
    first = torch.cat([stream.push(a[:, s: s + 4]) for s in range(0, 20, 4)], -1).float()
    stream.reset()  # in place: the graph keeps reading the same buffers
    second = torch.cat([stream.push(b[:, s: s + 4]) for s in range(0, 20, 4)], -1).float()
    del stream
    third = _stream(fp32.codec, a, [4] * 5, graphs, 4)  # a new stream reuses the shared state and graph
    assert graphs.captures == 1 and set(graphs.graphs) == {(1, 4)}
    assert graphs.graphed_chunks == 15 and graphs.eager_chunks == 0 and graphs.private_streams == 0
    assert [t.data_ptr() for t in state.buffers()] == ptrs
    _check("utterance 1", first, fp32.codec.decode(a).float(), "fp32")
    _check("utterance 2 after reset", second, fp32.codec.decode(b).float(), "fp32")
    assert torch.equal(third, first)  # same codes, same graph, same fresh state: bit for bit
    graphs.release()


def test_uneven_chunks_run_eagerly_and_stay_continuous(fp32):
    """A prefix push (as the ICL reference codes are) and a short final chunk have no graph: they run
    eagerly on the same state, between graphed chunks, and the audio has no seam."""
    graphs = CodecGraphs(fp32.codec.decoder)
    codes = _codes(1, 3 + 8 + 8 + 5, seed=3)
    joined = _stream(fp32.codec, codes, [3, 8, 8, 5], graphs, 8)
    assert set(graphs.graphs) == {(1, 8)}
    assert graphs.graphed_chunks == 2 and graphs.eager_chunks == 2
    one = fp32.codec.decode(codes).float()
    _check("prefix 3 + 8 + 8 + final 5", joined, one, "fp32")
    for s, e in ((0, 3), (3, 11), (11, 19), (19, 24)):  # each piece, boundaries included
        _check(f"frames {s}..{e}", joined[:, s * 1920: e * 1920], one[:, s * 1920: e * 1920], "fp32")
    graphs.release()


def _req():
    return Request(mode="custom", text="Streaming audio must equal the whole decode, graphs or not.",
                   language="English", speaker="ryan")


@pytest.mark.parametrize("takes,chunk", [(1, 4), (1, 8), (2, 4)])
def test_engine_stream_uses_codec_graphs_and_equals_generate(fp32, takes, chunk):
    g = fp32.codec_graphs
    frames = 30
    params = fp32.defaults.replace(max_new_tokens=frames)
    whole = fp32.generate(_req(), takes=takes, seed=4, params=params)
    before = g.stats()
    parts = list(fp32.stream(_req(), takes=takes, seed=4, params=params, chunk_frames=chunk))
    after = g.stats()
    assert after["graphed_chunks"] - before["graphed_chunks"] == frames // chunk
    assert after["eager_chunks"] - before["eager_chunks"] == (1 if frames % chunk else 0)
    assert after["private_streams"] == before["private_streams"]
    if takes == 1:  # pre-captured at load: streaming pays no capture
        assert after["captures"] == before["captures"]
    assert (takes, chunk) in g.graphs
    for i in range(takes):
        joined = joined_take(parts, i)
        assert joined.shape[0] == whole.lengths[i]
        _check(f"stream vs generate, take {i}", joined, whole.audio[i, : whole.lengths[i]], "fp32")


def test_engine_icl_stream_under_codec_graphs(tiny_checkpoints):
    """ICL: the reference codes are decoded eagerly as left context, then the chunks replay graphs."""
    base = _load(tiny_checkpoints["base"], "fp32")
    g = torch.Generator().manual_seed(5)
    voice = Voice(spk_embedding=0.1 * torch.randn(base.cfg.embedding_width, generator=g),
                  model_size=base.cfg.tts_model_size, ref_codes=torch.randint(0, 2048, (13, 16), generator=g),
                  ref_text="Reference words.")
    req = Request(mode="clone", text="Streaming a cloned voice.", language="English", voice=voice)
    params = base.defaults.replace(max_new_tokens=12)
    whole = base.generate(req, seed=1, params=params)
    before = base.codec_graphs.stats()
    joined = joined_take(base.stream(req, seed=1, params=params, chunk_frames=4), 0)
    after = base.codec_graphs.stats()
    assert after["graphed_chunks"] - before["graphed_chunks"] == 3
    assert after["eager_chunks"] - before["eager_chunks"] == 1  # the 13-frame reference prefix
    _check("ICL stream vs generate", joined, whole.audio[0], "fp32")
    base.release()


def test_release_drops_codec_graphs(tiny_checkpoints):
    eng = _load(tiny_checkpoints["custom_voice"], "fp32")
    graphs = eng.codec_graphs
    assert graphs is not None and graphs.graphs
    eng.release()
    assert eng.codec_graphs is None and not graphs.graphs and not graphs.states and graphs.pool is None


def test_capture_failure_falls_back_with_one_warning(fp32, monkeypatch, caplog):
    """Capture fails after the warm-up decodes: one warning, the state is put back, chunks run eagerly."""
    def broken_graph(*args, **kwargs):
        raise RuntimeError("capture refused (test)")

    graphs = CodecGraphs(fp32.codec.decoder)
    codes = _codes(1, 12, seed=6)
    monkeypatch.setattr(torch.cuda, "graph", broken_graph)
    with caplog.at_level("WARNING", logger="engine.gpu.codec_graph"):
        joined = _stream(fp32.codec, codes, [4, 4, 4], graphs, 4)
    monkeypatch.undo()
    assert len([r for r in caplog.records if "capture failed" in r.getMessage()]) == 1
    assert graphs.failure and not graphs.graphs and graphs.eager_chunks == 3
    _check("eager after failed capture", joined, fp32.codec.decode(codes).float(), "fp32")
    graphs.release()


def test_engine_codec_capture_failure(tiny_checkpoints, monkeypatch):
    """auto: a note and eager streaming, frame graphs stay on; on: a typed error."""
    def refuse(self, batch, frames):
        self.failure = "RuntimeError: capture refused (test)"
        return False

    monkeypatch.setattr(CodecGraphs, "capture", refuse)
    eng = _load(tiny_checkpoints["custom_voice"], "fp32", cuda_graphs="auto")
    assert eng.info.cuda_graphs and eng.codec_graphs is None
    assert any("codec CUDA graphs: capture failed" in n for n in eng.info.notes), eng.info.notes
    params = eng.defaults.replace(max_new_tokens=6)
    whole = eng.generate(_req(), params=params)
    joined = joined_take(eng.stream(_req(), params=params, chunk_frames=4), 0)
    _check("stream without codec graphs", joined, whole.audio[0], "fp32")
    eng.release()
    with pytest.raises(UnsupportedConfigError, match="codec CUDA graph"):
        _load(tiny_checkpoints["custom_voice"], "fp32", cuda_graphs="on")
