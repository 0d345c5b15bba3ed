"""The codec decoder under CUDA graphs: piece graphs of 32/16/8/4/2/1 frames (skipped without CUDA).

Every decode (whole utterances of any length, streamed chunks of any size, the ICL prefix) replays graphs
captured at load, on the same DecodeState buffers as the eager chunked decode, and equals the one-pass
decode. Tolerances: fp32 (TF32 off, see conftest.py) 1e-5, the bound the CPU tests use for chunked vs
one-pass decoding. bf16: graph and eager run the same kernels on the same inputs (identical in practice;
the bound only leaves room for a different library algorithm under capture), while chunked vs one pass
rounds differently in bf16 at every chunk boundary: on the CPU with the tiny checkpoint codec that is up
to ~0.009 max and ~3e-4 rms on output of rms ~0.2, so the bf16 bounds are 0.05 max and 5e-3 rms.
"""
import threading

import pytest
import torch

from engine import Engine, Request, Voice
from engine.checkpoint import loader
from tests.support.streaming_decoder import StreamingDecoder
from engine.codec.decoder import SnakeBeta
from engine.errors import CheckpointError, UnsupportedConfigError
from engine.gpu.buckets import batch_bucket
from engine.gpu.codec_graph import PIECES, CodecGraphs, final_pieces, pieces
from engine.codec_session import WHOLE_PIECE_FRAMES as FLUSH_FRAMES
from tests.support.decoding import joined_take

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


def _stream(codec, codes, sizes, graphs=None):
    """Push codes [B, T, 16] in pieces of `sizes` frames; returns the joined audio (float32)."""
    assert sum(sizes) == codes.shape[1]
    dec = StreamingDecoder(codec, batch=codes.shape[0], graphs=graphs)
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


def test_load_precaptures_every_piece_for_one_take(tiny_checkpoints):
    eng = _load(tiny_checkpoints["custom_voice"], "fp32")
    g = eng.codec_graphs
    assert isinstance(g, CodecGraphs) and g.failure is None
    assert set(g.graphs) == {(1, k) for k in PIECES}
    assert any(n.startswith("codec CUDA graphs: on") for n in eng.info.notes), eng.info.notes
    assert g.capture_seconds > 0 and g.late_captures == 0
    # the capture warm-up decoded zeros on the shared state: it must have been put back to fresh
    assert all(not t.any() for state in g.states.values() for t in state.buffers())
    eng.generate(_req(), takes=3, params=eng.defaults.replace(max_new_tokens=5))  # bucket 4: before decoding
    assert set(g.graphs) == {(b, k) for b in (1, 4) for k in PIECES} and g.late_captures == 0
    eng.release()


@pytest.mark.parametrize("batch", [1, 3])
def test_whole_decode_any_length_equals_one_pass(fp32, batch):
    """Lengths 1..600 through the piece graphs (the last run one zero-padded piece): no capture, within 1e-5
    of one pass (fp32)."""
    g = fp32.codec_graphs
    g.precapture([batch_bucket(batch)])  # what a request of `batch` takes does before it decodes
    before = g.stats()
    worst = 0.0
    for frames in list(range(1, 41)) + [63, 64, 65, 127, 250, 299, 300, 301, 417, 599, 600]:
        codes = _codes(batch, frames, seed=frames * 7 + batch)
        replays = g.replays
        got = g.decode_utterance(codes).float()
        assert g.replays - replays == len(final_pieces(frames))
        one = fp32.codec.decoder(codes.transpose(1, 2)).float()  # one pass, even past 300 frames
        assert got.shape == one.shape == (batch, frames * 1920)
        worst = max(worst, (got - one).abs().max().item())
        assert worst <= 1e-5, (frames, worst)
    after = g.stats()
    print(f"piece-graph decode vs one pass, batch {batch}, lengths 1..600: max {worst:.3g}")
    assert after["captures"] == before["captures"] and after["late_captures"] == 0
    assert after["eager_pieces"] == before["eager_pieces"] and after["replays"] > before["replays"]


@pytest.mark.parametrize("dtype,batch,chunk", [("fp32", 1, 4), ("fp32", 2, 8), ("fp32", 3, 1), ("fp32", 1, 12),
                                               ("bf16", 1, 4), ("bf16", 2, 8)])
def test_graph_stream_equals_eager_and_one_pass(request, dtype, batch, chunk):
    engine = request.getfixturevalue(dtype)
    graphs = CodecGraphs(engine.codec.decoder)
    graphs.precapture([1, 2, 4])
    frames = 26
    codes = _codes(batch, frames, seed=batch * 10 + chunk)
    sizes = _chunks(frames, chunk)
    graphed = _stream(engine.codec, codes, sizes, graphs)
    eager = _stream(engine.codec, codes, sizes)
    one = engine.codec.decode(codes).float()
    assert graphed.shape == one.shape == (batch, frames * 1920)
    assert graphs.late_captures == 0 and graphs.eager_pieces == 0
    assert graphs.replays == sum(len(pieces(n)) for n in sizes)
    replay = (graphed - eager).abs().max().item()
    print(f"graph vs eager stream ({dtype}, batch {batch}, chunk {chunk}): max {replay:.3g}")
    assert replay <= (REPLAY_TOL[dtype] if chunk in PIECES else TOL[dtype][0])  # 12 = 8 + 4 splits differently
    _check(f"graph stream vs one pass, batch {batch}, chunk {chunk}", graphed, one, dtype)
    graphs.release()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_snake_under_codec_graphs(tiny_checkpoints, dtype):
    """With the Triton kernels on, every SnakeBeta runs as one launch (in the tiny codec's narrow residual units
    with the 1x1 conv and the residual add), captured in the piece graphs; whole decodes through the pieces equal
    the torch ops' one pass within the bounds above (the kernels round where torch does; the sine differs from
    torch's by an ulp in some elements, and the 1x1 conv's sum runs in another order)."""
    from engine import kernels

    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)
    eng = Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype=dtype, cuda_graphs="on", triton="on",
                      max_seq_len=512)
    assert {"snake", "snake_conv1x1"} <= set(eng.info.kernels) and eng.codec_graphs is not None
    snakes = [m for m in eng.codec.decoder.modules() if isinstance(m, SnakeBeta)]
    table = snakes[0].kernels
    for batch, frames in ((1, 1), (1, 45), (3, 13)):
        codes = _codes(batch, frames, seed=frames + batch)
        got = eng.codec_graphs.decode_utterance(codes).float()
        eng.codec.decoder.use_kernels(None)  # the reference: torch ops, one pass
        one = eng.codec.decode(codes).float()
        eng.codec.decoder.use_kernels(table)
        _check(f"triton snake pieces vs torch one pass, batch {batch}, {frames} frames", got, one, dtype)
    assert snakes and all(m._params is not None for m in snakes)  # e^α, 1 / (e^β + 1e-9) kept, not per call
    eng.release()


def test_one_state_across_utterances(fp32):
    graphs = CodecGraphs(fp32.codec.decoder)
    graphs.precapture([1])
    a, b = _codes(1, 20, seed=1), _codes(1, 20, seed=2)
    stream = StreamingDecoder(fp32.codec, batch=1, graphs=graphs)
    state = graphs.states[1]
    ptrs = [t.data_ptr() for t in state.buffers()]
    first = torch.cat([stream.push(a[:, s: s + 4]) for s in range(0, 20, 4)], -1).float()
    stream.reset()  # in place: the graphs keep reading the same buffers
    second = torch.cat([stream.push(b[:, s: s + 4]) for s in range(0, 20, 4)], -1).float()
    del stream
    third = _stream(fp32.codec, a, [4] * 5, graphs)  # a new stream reuses the shared state and graphs
    assert graphs.captures == len(PIECES) and graphs.late_captures == 0
    assert graphs.replays == 15 and graphs.eager_pieces == 0 and graphs.private_streams == 0
    assert [t.data_ptr() for t in state.buffers()] == ptrs
    _check("utterance 1", first, fp32.codec.decode(a).float(), "fp32")
    _check("utterance 2 after reset", second, fp32.codec.decode(b).float(), "fp32")
    assert torch.equal(third, first)  # same codes, same graphs, same fresh state: bit for bit


def test_uneven_chunks_stay_continuous(fp32):
    """A prefix push (as the ICL reference codes are) and a short final chunk split into pieces between
    whole chunks, and the audio has no seam."""
    graphs = CodecGraphs(fp32.codec.decoder)
    graphs.precapture([1])
    codes = _codes(1, 3 + 8 + 8 + 5, seed=3)
    joined = _stream(fp32.codec, codes, [3, 8, 8, 5], graphs)
    assert graphs.replays == 2 + 1 + 1 + 2 and graphs.eager_pieces == 0
    one = fp32.codec.decode(codes).float()
    _check("prefix 3 + 8 + 8 + final 5", joined, one, "fp32")
    for s, e in ((0, 3), (3, 11), (11, 19), (19, 24)):  # each piece, boundaries included
        _check(f"frames {s}..{e}", joined[:, s * 1920: e * 1920], one[:, s * 1920: e * 1920], "fp32")
    graphs.release()


def _req():
    return Request(mode="custom", text="Streaming audio must equal the whole decode, graphs or not.",
                   language="English", speaker="ryan")


@pytest.mark.parametrize("takes,chunk", [(1, 4), (1, 8), (2, 4), (3, 5), (1, 32)])
def test_engine_stream_uses_codec_graphs_and_equals_generate(fp32, takes, chunk):
    g = fp32.codec_graphs
    frames = 70  # the whole decode overlaps the frames in pieces of FLUSH_FRAMES, then the last 6 as one of 8
    params = fp32.defaults.replace(max_new_tokens=frames)
    whole = fp32.generate(_req(), takes=takes, seed=4, params=params)  # captures a new takes bucket first
    before = g.stats()
    again = fp32.generate(_req(), takes=takes, seed=4, params=params)
    parts = list(fp32.stream(_req(), takes=takes, seed=4, params=params, chunk_frames=chunk))
    after = g.stats()
    assert torch.equal(again.audio, whole.audio)
    one = fp32.codec.decode(torch.stack(whole.codes).cuda()).float().cpu()  # no EOS: every take is whole
    _check(f"overlapped whole decode vs one pass, takes {takes}", whole.audio, one, "fp32")
    sizes = _chunks(frames, chunk)
    runs, rest = divmod(frames, FLUSH_FRAMES)  # generate() pushes 4 frames at a time, a divisor of FLUSH_FRAMES
    overlapped = runs * len(pieces(FLUSH_FRAMES)) + len(final_pieces(rest))
    assert after["replays"] - before["replays"] == overlapped + sum(len(pieces(n)) for n in sizes)
    assert after["eager_pieces"] == before["eager_pieces"] and after["private_streams"] == before["private_streams"]
    assert after["captures"] == before["captures"] and after["late_captures"] == 0  # all captured at load
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
    before = base.codec_graphs.stats()
    whole = base.generate(req, seed=1, params=params)  # decodes the 13-frame prefix once and keeps its state
    joined = joined_take(base.stream(req, seed=1, params=params, chunk_frames=4), 0)
    again = joined_take(base.stream(req, seed=1, params=params, chunk_frames=4), 0)
    after = base.codec_graphs.stats()
    assert after["prefixes"] - before["prefixes"] == 1 and after["prefix_hits"] - before["prefix_hits"] == 2
    assert after["replays"] - before["replays"] == len(pieces(13)) + len(final_pieces(12)) + 2 * 3
    assert after["eager_pieces"] == before["eager_pieces"] and after["late_captures"] == 0
    assert torch.equal(joined, again)
    _check("ICL stream vs generate", joined, whole.audio[0], "fp32")
    one = base.codec.decode(torch.cat([voice.ref_codes[None], whole.codes[0][None]], 1).cuda()).float()
    _check("ICL generate vs one pass over reference + codes", whole.audio[0][None].cuda(), one[:, 13 * 1920:], "fp32")
    base.release()


def _precapture_threads():
    return [t for t in threading.enumerate() if t.name == "codec-precapture"]


def test_load_captures_codec_beside_talker(tiny_checkpoints, monkeypatch):
    """The one-take pieces are captured on a thread that starts once the codec's weights are in, before the
    talker's are read, and the load returns with that thread done and every piece captured."""
    seen = []
    real = loader.materialize

    def watch(build, device, dtype, weights, prefix):
        if prefix == "talker.":
            seen.append(len(_precapture_threads()))
        return real(build, device, dtype, weights, prefix)

    monkeypatch.setattr(loader, "materialize", watch)
    eng = _load(tiny_checkpoints["custom_voice"], "fp32")
    assert seen == [1]  # the codec's thread was running while the talker loaded
    g = eng.codec_graphs
    assert not _precapture_threads() and g._beside is None and g.failure is None
    assert set(g.graphs) == {(1, k) for k in PIECES} and g.late_captures == 0
    eng.release()


def test_each_warm_bucket_is_captured_on_a_thread_of_its_own(tiny_checkpoints, monkeypatch):
    """At warm_takes 4 the 4-row pieces are captured on their own thread, started by the one-take thread once the
    libraries are up (its first eager frame), and the load waits for both."""
    seen = {}
    real = CodecGraphs.capture

    def watch(self, bucket, frames):
        if (bucket, frames) not in self.graphs:  # a real capture (precapture on the main thread finds them made)
            seen.setdefault(bucket, set()).add(threading.current_thread())
        return real(self, bucket, frames)

    monkeypatch.setattr(CodecGraphs, "capture", watch)
    eng = Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype="fp32", cuda_graphs="on",
                      max_takes=4, warm_takes=4, max_seq_len=512)
    try:
        assert set(seen) == {1, 4} and all(len(threads) == 1 for threads in seen.values())
        one, four = seen[1].pop(), seen[4].pop()
        assert one is not four and one.name == four.name == "codec-precapture"
        assert not _precapture_threads() and eng.codec_graphs._beside is None
        assert set(eng.codec_graphs.graphs) == {(b, k) for b in (1, 4) for k in PIECES}
    finally:
        eng.release()


def test_codec_thread_error_reaches_the_load(tiny_checkpoints, monkeypatch):
    """An error on the codec's thread is raised where the load needs the codec: auto falls back to eager with a
    note, on raises a typed error."""
    def broken_state(self, bucket):
        raise RuntimeError("codec state refused (test)")

    monkeypatch.setattr(CodecGraphs, "state", broken_state)
    eng = _load(tiny_checkpoints["custom_voice"], "fp32", cuda_graphs="auto")
    assert not eng.info.cuda_graphs and eng.codec_graphs is None
    assert any("codec state refused (test)" in n for n in eng.info.notes), eng.info.notes
    eng.release()
    with pytest.raises(UnsupportedConfigError, match="codec state refused"):
        _load(tiny_checkpoints["custom_voice"], "fp32", cuda_graphs="on")
    assert not _precapture_threads()


def test_failed_load_waits_for_the_codec_thread(tiny_checkpoints, monkeypatch):
    """A load that fails after the codec's thread started does not leave it running."""
    real = loader.materialize

    def refuse_talker(build, device, dtype, weights, prefix):
        if prefix == "talker.":
            raise CheckpointError("talker refused (test)")
        return real(build, device, dtype, weights, prefix)

    monkeypatch.setattr(loader, "materialize", refuse_talker)
    with pytest.raises(CheckpointError, match="talker refused"):
        _load(tiny_checkpoints["custom_voice"], "fp32")
    assert not _precapture_threads()


def test_release_drops_codec_graphs(tiny_checkpoints):
    eng = _load(tiny_checkpoints["custom_voice"], "fp32")
    graphs = eng.codec_graphs
    assert graphs is not None and graphs.graphs
    eng.release()
    assert eng.codec_graphs is None and not graphs.graphs and not graphs.states and not graphs.pools


def test_capture_failure_falls_back_with_one_warning(fp32, monkeypatch, caplog):
    """Capture fails after the warm-up decodes: one warning, the state is put back, chunks run eagerly."""
    def broken_graph(*args, **kwargs):
        raise RuntimeError("capture refused (test)")

    graphs = CodecGraphs(fp32.codec.decoder)
    codes = _codes(1, 12, seed=6)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", broken_graph)
    with caplog.at_level("WARNING", logger="engine.gpu.codec_graph"):
        joined = _stream(fp32.codec, codes, [4, 4, 4], graphs)
    monkeypatch.undo()
    assert len([r for r in caplog.records if "capture failed" in r.getMessage()]) == 1
    assert graphs.failure and not graphs.graphs and graphs.eager_pieces == 3
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
