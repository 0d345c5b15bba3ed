"""Codec decoder: key-for-key loading and waveform parity with the official qwen-tts 0.1.1 decoder,
exact chunked (streaming) decode, and input validation. CPU, fp32, tiny codec config."""
from __future__ import annotations

import math

import pytest
import torch

from engine.checkpoint import presets
from engine.codec import CodecConfig, CodecDecoder, SpeechTokenizer
from tests.support.streaming_decoder import StreamingDecoder
from engine.codec.config import DecoderConfig
from engine.codec.decoder import DecodeState
from engine.errors import CheckpointError, InvalidInputError

TOL = 1e-5


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial values for every tensor, so no parameter can be silently ignored or misrouted."""
    g = torch.Generator().manual_seed(seed)
    transposed = {n + ".weight" for n, m in module.named_modules() if isinstance(m, torch.nn.ConvTranspose1d)}
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            r = torch.randn(p.shape, generator=g)
            if leaf == "cluster_usage":
                v = torch.rand(p.shape, generator=g) * 2 + 0.25
                v[:3] = torch.tensor([1e-7, 0.0, 5e-6])  # exercise the clamp at 1e-5
            elif leaf == "embedding_sum":
                v = r
                v[:3] *= 1e-5  # rows whose usage is clamped: vectors stay O(1)
            elif leaf in ("alpha", "beta"):  # SnakeBeta, log scale
                v = 0.3 * r
            elif leaf == "scale":  # layer scale: large enough that the transformer matters
                v = 0.3 + 0.1 * r
            elif leaf == "gamma":  # ConvNeXt
                v = 0.2 * r
            elif p.dim() == 1:  # norm weights and biases
                v = (1.0 + 0.1 * r) if ("norm" in name and leaf == "weight") else 0.1 * r
            else:
                fan_in = p[0].numel()
                if name in transposed:  # weight [in, out, k]; each output sees in * k / stride inputs
                    fan_in = max(1, p.shape[0] * p.shape[2] // 2)
                v = r / math.sqrt(fan_in)
            p.copy_(v)
        last = module.decoder[-1].conv if hasattr(module, "decoder") else None
        if last is not None:
            last.weight.mul_(0.01)  # keep most samples inside [-1, 1] so clamping hides nothing


@pytest.fixture(scope="module")
def pair(qwen_tts):
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    raw = presets.codec_config("tiny")
    official = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**raw)).eval().float()
    _randomize(official.decoder, seed=1234)

    ours = SpeechTokenizer(CodecConfig.from_dict(raw)).eval()
    theirs = official.decoder.state_dict()
    mine = ours.decoder.state_dict()
    assert set(mine) == set(theirs), (sorted(set(mine) ^ set(theirs)))[:20]
    ours.decoder.load_state_dict(theirs, strict=True)
    file_keys = {"decoder." + k for k in theirs}
    assert {k for k in ours.state_dict()} == file_keys  # container prefixes match the file
    return official, ours


def _codes(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (b, t, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("frames", [30, 100])
def test_parity_with_official_decode(pair, frames):
    """In float64 ours equals the official decode to rounding (the same function); in float32 ours is as close
    to the float64 result as the official float32 decode is (each sums its convs in its own order: ours
    time-major, channels-last, so float32 agreement to the last bits is not expected; with these unit-gain
    random weights one float32 pass is ~5e-5 from float64 whatever the order)."""
    import copy

    official, ours = pair
    codes = _codes(2, frames, seed=frames)
    with torch.no_grad():
        ref = torch.stack(official.decode(codes, return_dict=True).audio_values)
        ref64 = torch.stack(copy.deepcopy(official).double().decode(codes, return_dict=True).audio_values)
    got, got64 = ours.decode(codes), copy.deepcopy(ours).double().decode(codes)
    assert got.shape == (2, frames * 1920) == ref.shape and got64.dtype == ref64.dtype == torch.float64
    clipped = (ref.abs() >= 1).float().mean().item()
    assert ref.std() > 0.05 and clipped < 0.2, (ref.std(), clipped)
    exact = (got64 - ref64).abs().max().item()
    theirs, mine = (ref - ref64).abs().max().item(), (got - ref64).abs().max().item()
    print(f"T={frames}: float64 max|ours - official| = {exact:.3g}; float32 from float64: ours {mine:.3g}, "
          f"official {theirs:.3g} (rms {ref.pow(2).mean().sqrt():.3f}, clipped {clipped:.1%})")
    assert exact <= 1e-9
    assert mine <= max(TOL, 2 * theirs)


@pytest.fixture(scope="module")
def spec_weights():
    """Tiny tokenizer with the checkpoint generator's weights (engine/checkpoint/random_init.py), fp32.

    The generator halves the waveform stack's convs: with unit-gain random weights those blocks amplify
    fp32 rounding ~1000x (one fp32 pass is ~6e-5 from fp64, as is any other evaluation order), which
    would make a 1e-5 bound test fp32 chaos rather than the chunking. The untamed case is checked in
    float64 instead (test_streaming_is_exact_in_float64).
    """
    from engine.checkpoint.random_init import init_module

    return init_module(SpeechTokenizer(CodecConfig.from_dict(presets.codec_config("tiny"))).eval(), seed=0)


def _stream(tok, codes, chunk, context):
    stream = StreamingDecoder(tok, batch=codes.shape[0], context_frames=context)
    parts = [stream.push(codes[:, s: s + chunk]) for s in range(0, codes.shape[1], chunk)]
    n = codes.shape[1]
    assert [p.shape for p in parts] == [(codes.shape[0], min(chunk, n - s) * 1920) for s in range(0, n, chunk)]
    return torch.cat(parts, dim=-1)


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_streaming_equals_one_pass(spec_weights, chunk):
    codes = _codes(2, 24, seed=7)
    full = spec_weights.decode(codes)
    assert 0.05 < full.pow(2).mean().sqrt() < 0.6
    diff = (_stream(spec_weights, codes, chunk, None) - full).abs().max().item()
    print(f"fp32 chunk={chunk}: max|stream - full| = {diff:.3g} (rms {full.pow(2).mean().sqrt():.3f})")
    assert diff <= TOL


def test_streaming_is_exact_in_float64(pair):
    """With the non-trivial weights fp32 rounding alone (one pass vs fp64) is ~2e-5, so exactness of the
    chunked algorithm itself is checked in float64, where only rounding at 1e-13 may differ."""
    _, ours = pair
    tok = SpeechTokenizer(ours.cfg).eval()
    tok.load_state_dict(ours.state_dict())
    tok = tok.double()
    codes = _codes(2, 12, seed=11)
    full = tok.decode(codes)
    for chunk in (1, 5):
        diff = (_stream(tok, codes, chunk, None) - full).abs().max().item()
        print(f"fp64 chunk={chunk}: max|stream - full| = {diff:.3g}")
        assert diff <= 1e-10


def test_windowed_streaming(spec_weights):
    """Windowed re-decode is exact while the window reaches frame 0, and only approximate once it cuts the
    past shorter than the receptive field (2 layers x 71 + 11 frames on the tiny config)."""
    codes = _codes(1, 30, seed=8)
    full = spec_weights.decode(codes)
    diff = (_stream(spec_weights, codes, 9, 30) - full).abs().max().item()
    assert diff <= TOL
    cut = (_stream(spec_weights, codes, 9, 8) - full).abs().max().item()
    print(f"windowed: context 30 -> {diff:.3g}, context 8 -> {cut:.3g}")
    assert cut > 10 * TOL  # the receptive-field figure (docs/PERFORMANCE_NOTES.md) is not vacuous


def test_long_decode_is_chunked_exactly(spec_weights):
    codes = _codes(1, 30, seed=3)
    one = spec_weights.decode(codes)
    chunked = spec_weights.decode(codes, max_frames_per_pass=12)
    assert (one - chunked).abs().max().item() <= TOL


def test_stream_push_zero_and_reset(spec_weights):
    ours = spec_weights
    codes = _codes(1, 6, seed=5)
    stream = StreamingDecoder(ours.decoder, batch=1)
    assert stream.push(codes[:, :0]).shape == (1, 0)
    first = stream.push(codes)
    stream.reset()
    assert torch.equal(stream.push(codes), first)


@pytest.fixture(scope="module")
def small_window():
    """Tiny tokenizer with a 5-frame attention window and grouped K/V heads (2 query heads share 1), so
    short codes already span many windows and the K/V head repeat runs."""
    from engine.checkpoint.random_init import init_module

    raw = presets.codec_config("tiny")
    raw["decoder_config"].update(sliding_window=5, num_key_value_heads=1)
    return init_module(SpeechTokenizer(CodecConfig.from_dict(raw)).eval(), seed=1)


def _pieces(tok, codes, sizes, state=None):
    """Decode codes [B, T, Q] in pieces of `sizes` frames on one DecodeState."""
    assert sum(sizes) == codes.shape[1]
    state = DecodeState() if state is None else state
    parts, s = [], 0
    with torch.inference_mode():
        for n in sizes:
            parts.append(tok.decoder(codes[:, s: s + n].transpose(1, 2), state))
            s += n
    return torch.cat(parts, dim=-1)


@pytest.mark.parametrize("sizes", [[1] * 8 + [2, 7, 12, 1, 3, 3], [36], [4, 1, 30, 1]])
def test_varying_chunks_equal_one_pass_small_window(small_window, sizes):
    """1-frame chunks, chunks longer than the window (5) and uneven mixes, with GQA."""
    codes = _codes(2, 36, seed=21)
    full = small_window.decode(codes)
    diff = (_pieces(small_window, codes, sizes) - full).abs().max().item()
    print(f"window 5, pieces {sizes}: max|pieces - full| = {diff:.3g}")
    assert diff <= TOL


def test_varying_chunks_equal_one_pass_full_window(spec_weights):
    """The real 72-frame window: a chunk longer than it, between 1-frame chunks."""
    codes = _codes(1, 87, seed=22)
    full = spec_weights.decode(codes)
    diff = (_pieces(spec_weights, codes, [1, 80, 5, 1]) - full).abs().max().item()
    assert diff <= TOL


def test_state_is_static_and_reset_in_place(small_window):
    """Buffers never move once allocated, `zero_()` gives back a fresh state, and reusing it equals a
    decode on a brand-new state exactly."""
    a, b = _codes(2, 20, seed=23), _codes(2, 20, seed=24)
    state = DecodeState()
    _pieces(small_window, a[:, :3], [3], state)
    ptrs = [t.data_ptr() for t in state.buffers()]
    shapes = [t.shape for t in state.buffers()]
    assert state.frames.tolist() == [3, 3] and state.frames.dtype == torch.long  # one position per row
    _pieces(small_window, a[:, 3:], [1, 9, 7], state)
    assert state.frames.tolist() == [20, 20]
    assert [t.data_ptr() for t in state.buffers()] == ptrs and [t.shape for t in state.buffers()] == shapes
    kv = next(iter(state.kv.values()))
    assert kv[0].shape == (2, 1, 4, 16)  # [B, kv_heads, window - 1, head_dim]
    state.zero_()
    assert all(not t.any() for t in state.buffers())
    reused = _pieces(small_window, b, [6, 1, 13], state)
    fresh = _pieces(small_window, b, [6, 1, 13])
    assert torch.equal(reused, fresh)
    assert [t.data_ptr() for t in state.buffers()] == ptrs


def test_batch_rows_are_independent(small_window):
    codes = _codes(3, 17, seed=25)
    batch = _pieces(small_window, codes, [4, 4, 4, 4, 1])
    assert (batch - small_window.decode(codes)).abs().max().item() <= TOL
    for i in range(3):
        alone = _pieces(small_window, codes[i: i + 1], [5, 12])
        assert (alone[0] - batch[i]).abs().max().item() <= TOL, f"row {i}"


def test_rows_of_one_state_at_their_own_positions(small_window):
    """Slotted decoding: the rows of one state belong to different utterances that started at different
    chunks (start_row gives a row a fresh start, or the one-row state after a reference), each equal to its
    utterance decoded alone; a view of the state's first rows (first_rows) decodes those rows alone and advances
    them in the state."""
    a, b, ref = _codes(1, 21, seed=40), _codes(1, 9, seed=41), _codes(1, 7, seed=42)
    with torch.inference_mode():
        primed = DecodeState()
        small_window.decoder(ref.transpose(1, 2), primed, check=False)
        state = DecodeState()
        small_window.decoder(torch.zeros(4, 16, 1, dtype=torch.long), state, check=False)  # allocates [4, ...]
        state.start_row(0, None)
        one, two = state.first_rows(1), state.first_rows(2)
        out_a, out_b = [], []
        for start in range(0, 12, 4):  # row 0 alone for 12 frames, on the one-row view
            out_a.append(small_window.decoder(a[:, start: start + 4].transpose(1, 2), one, check=False)[0])
        assert state.frames.tolist() == [12, 1, 1, 1]  # the view advanced row 0 of the state, and no other
        state.start_row(1, primed.snapshot())  # row 1 begins after the reference, row 0 goes on
        for start in range(0, 8, 4):
            wav = small_window.decoder(torch.cat([a[:, 12 + start: 16 + start], b[:, start: start + 4]])
                                       .transpose(1, 2), two, check=False)
            out_a.append(wav[0])
            out_b.append(wav[1])
        assert state.frames.tolist() == [20, 7 + 8, 1, 1]
        wav = small_window.decoder(torch.cat([a[:, 20:], b[:, 8:], b[:, :1], b[:, :1]]).transpose(1, 2), state,
                                   check=False)  # the two rows go on in the whole four-row state
        out_a.append(wav[0])
        out_b.append(wav[1])
    assert (torch.cat(out_a) - small_window.decode(a)[0]).abs().max().item() <= TOL
    after_ref = small_window.decode(torch.cat([ref, b], 1))[0, 7 * small_window.decoder.samples_per_frame:]
    assert (torch.cat(out_b) - after_ref).abs().max().item() <= TOL


def test_streaming_with_codec_graphs_object_uncaptured(small_window):
    """StreamingDecoder through CodecGraphs (capture off, so it runs on the CPU): one shared state per batch,
    reset in place between utterances, a concurrent stream falls back to a private state, results exact."""
    from engine.gpu.codec_graph import CodecGraphs

    graphs = CodecGraphs(small_window.decoder, capture=False)
    codes = _codes(1, 11, seed=26)
    full = small_window.decode(codes)
    first = StreamingDecoder(small_window, batch=1, graphs=graphs)
    shared = graphs.states[1]
    busy = StreamingDecoder(small_window, batch=1, graphs=graphs)
    assert graphs.private_streams == 1 and busy._state is not shared
    joined = []
    for stream in (first, busy):
        joined.append(torch.cat([stream.push(codes[:, s: s + 4]) for s in range(0, 11, 4)], dim=-1))
        assert (joined[-1] - full).abs().max().item() <= TOL
    first.reset()
    assert int(shared.frames) == 0
    assert torch.equal(torch.cat([first.push(codes[:, s: s + 4]) for s in range(0, 11, 4)], dim=-1), joined[0])
    del first, busy
    again = StreamingDecoder(small_window, batch=1, graphs=graphs)
    assert again._state is shared and graphs.private_streams == 1
    stats = graphs.stats()
    # shared state: pushes of 4, 4, 3 frames run as pieces [4], [4], [2, 1], twice; the private one 3 calls
    assert stats["replays"] == 0 and stats["eager_pieces"] == 4 + 3 + 4 and stats["captured"] == []
    with pytest.raises(InvalidInputError, match="stateful"):
        StreamingDecoder(small_window, batch=1, context_frames=4, graphs=graphs)
    graphs.release()
    assert not graphs.states and not graphs.graphs


def test_codec_graph_capture_failure_falls_back_to_eager_once(small_window, caplog):
    """A failed capture (here: no CUDA) logs one warning, leaves the state where it was and decodes eagerly."""
    from engine.gpu.codec_graph import CodecGraphs

    graphs = CodecGraphs(small_window.decoder)
    codes = _codes(1, 10, seed=27)
    stream = StreamingDecoder(small_window, batch=1, graphs=graphs)
    with caplog.at_level("WARNING", logger="engine.gpu.codec_graph"):
        joined = torch.cat([stream.push(codes[:, s: s + 4]) for s in range(0, 10, 4)], dim=-1)
    assert (joined - small_window.decode(codes)).abs().max().item() <= TOL
    warnings = [r for r in caplog.records if "capture failed" in r.getMessage()]
    assert len(warnings) == 1 and graphs.failure is not None
    assert graphs.stats()["eager_pieces"] == 3 and not graphs.graphs  # pieces [4], [4], [2]
    assert not graphs.capture(1, 8)


def test_invalid_input(pair):
    _, ours = pair
    good = _codes(1, 5, seed=9)
    with pytest.raises(InvalidInputError, match=r"\[batch, frames, 16\]"):
        ours.decode(good[0])
    with pytest.raises(InvalidInputError, match="16"):
        ours.decode(good[..., :15])
    with pytest.raises(InvalidInputError, match="0..2047"):
        ours.decode(torch.where(good == good[0, 0, 0], torch.tensor(2048), good))
    with pytest.raises(InvalidInputError, match="0..2047"):
        ours.decode(torch.full((1, 5, 16), -1))
    with pytest.raises(InvalidInputError, match="integer"):
        ours.decode(good.float())
    with pytest.raises(InvalidInputError, match="frames"):
        ours.decode(good[:, :0])
    with pytest.raises(InvalidInputError, match=r"\[batch, 16, frames\]"):
        ours.decoder(good)  # frame-major layout given to the [B, Q, T] decoder
    stream = StreamingDecoder(ours, batch=2)
    with pytest.raises(InvalidInputError, match=r"\[2, frames, 16\]"):
        stream.push(good)
    with pytest.raises(InvalidInputError):
        StreamingDecoder(ours, batch=0)


def test_config_errors_name_file_and_key():
    raw = presets.codec_config("tiny")
    del raw["decoder_config"]["sliding_window"]
    with pytest.raises(CheckpointError, match=r"sliding_window.*decoder_config"):
        CodecConfig.from_dict(raw, "x/speech_tokenizer/config.json")
    raw = presets.codec_config("tiny")
    del raw["decode_upsample_rate"]
    with pytest.raises(CheckpointError, match=r"'decode_upsample_rate' in x/config.json"):
        CodecConfig.from_dict(raw, "x/config.json")
    cfg = CodecConfig.from_dict(presets.codec_config("0.6b"))
    assert isinstance(cfg.decoder, DecoderConfig) and cfg.decoder.samples_per_frame == 1920
    assert cfg.encoder["model_type"] == "mimi" and cfg.decoder.hidden_size == 512
    n = sum(p.numel() for p in CodecDecoder(cfg.decoder).parameters())
    assert 90e6 < n < 130e6


def test_pieces_cover_every_length():
    from engine.gpu.codec_graph import PIECES, pieces

    for n in range(0, 200):
        split = pieces(n)
        assert sum(split) == n and all(s in PIECES for s in split) and split == sorted(split, reverse=True)
        assert len([s for s in split if s < PIECES[0]]) == len(set(s for s in split if s < PIECES[0]))
    assert pieces(13) == [8, 4, 1] and pieces(70) == [32, 32, 4, 2]


def test_final_pieces_pad_only_the_last_run():
    from engine.gpu.codec_graph import PIECES, final_pieces

    for n in range(200):
        split = final_pieces(n)
        assert all(s in PIECES for s in split) and split[:-1] == [PIECES[0]] * (len(split) - 1)
        rest = n - PIECES[0] * (len(split) - 1)  # the last run's real frames
        assert not split or 0 < rest <= split[-1] < 2 * rest  # one piece holds it, under twice its size
    assert final_pieces(13) == [16] and final_pieces(70) == [32, 32, 8] and final_pieces(64) == [32, 32]


@pytest.mark.parametrize("batch", [1, 3])
def test_whole_utterance_through_pieces_equals_one_pass(small_window, batch):
    """CodecGraphs.decode_utterance (capture off: the same pieces, eager) in a padded bucket equals one pass,
    and an ICL prefix is decoded once, then restored (the same audio as decoding it every time)."""
    from engine.gpu.codec_graph import CodecGraphs, final_pieces

    graphs = CodecGraphs(small_window.decoder, capture=False)
    for frames in (1, 13, 45):
        codes = _codes(batch, frames, seed=40 + frames)
        before = graphs.eager_pieces
        got = graphs.decode_utterance(codes)  # the last run is one piece padded with zero frames
        assert graphs.eager_pieces - before == len(final_pieces(frames))
        assert got.shape == (batch, frames * 1920)
        assert (got - small_window.decode(codes)).abs().max().item() <= TOL, frames
    assert set(graphs.states) == {1 if batch == 1 else 4}
    ref = _codes(1, 9, seed=50)[0]
    codes = _codes(batch, 11, seed=51)
    one = small_window.decode(torch.cat([ref[None].expand(batch, -1, -1), codes], 1))[:, 9 * 1920:]
    first = graphs.decode_utterance(codes, ref)
    again = graphs.decode_utterance(codes, ref)
    assert graphs.prefix_hits == 1 and len(graphs.prefixes) == 1
    assert torch.equal(first, again)
    assert (first - one).abs().max().item() <= TOL
    graphs.release()


def test_snake_params_are_cached_and_bit_identical():
    """SnakeBeta keeps e^α and 1 / (e^β + 1e-9) between calls: the output equals the per-call expression bit
    for bit, and the cache follows load_state_dict, dtype moves and autograd."""
    from engine.codec.decoder import SnakeBeta

    def per_call(act, x):  # the official expression (x [B, L, C] here), everything computed in the call
        freq = act.alpha.exp()
        return x + 1.0 / (act.beta.exp() + 1e-9) * torch.sin(x * freq).pow(2)

    g = torch.Generator().manual_seed(3)
    act = SnakeBeta(8)
    act.load_state_dict({"alpha": torch.randn(8, generator=g) * 0.5, "beta": torch.randn(8, generator=g) * 0.5})
    x = torch.randn(2, 5, 8, generator=g) * 3
    with torch.inference_mode():
        assert torch.equal(act(x), per_call(act, x))
        assert act.params()[0] is act.params()[0]  # computed once
    act.load_state_dict({"alpha": torch.randn(8, generator=g), "beta": torch.randn(8, generator=g)})
    with torch.no_grad():
        assert torch.equal(act(x), per_call(act, x))  # the in-place load bumped the version: recomputed
    act.to(torch.float64)
    with torch.inference_mode():
        assert torch.equal(act(x.double()), per_call(act, x.double()))
    act.to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(act(x.bfloat16()), per_call(act, x.bfloat16()))
    act.float()
    act(x).sum().backward()  # autograd on: computed in the call, gradients reach α and β
    assert act.alpha.grad is not None and act.beta.grad is not None


@pytest.mark.parametrize("dilation", [3, 9])
def test_folded_dilated_conv_is_the_dilated_conv(dilation):
    """CausalConv1d._folded (what CUDA runs for dilated convs): a (7, 1) conv over the time-major [B, L, C]
    viewed as [B, L / d, d, C] sums the same terms as the dilated conv, at every length (zero padding to a
    multiple of d dropped again)."""
    from engine.codec.decoder import CausalConv1d

    torch.manual_seed(dilation)
    conv = CausalConv1d(6, 5, 7, dilation=dilation).double()
    assert conv.conv.weight.stride() == (7 * 6, 1, 6)  # stored channels fastest
    for n in (1, 2, 5, 160, 161, 640):
        x = torch.randn(2, conv.left + n, 6, dtype=torch.float64)
        got = conv._folded(x, conv.conv.bias)
        assert got.shape == (2, n, 5)
        want = conv.conv(x.transpose(1, 2).contiguous()).transpose(1, 2)  # nn.Conv1d on [B, C, L]
        assert (got - want).abs().max().item() <= 1e-12, n
        x[:, : conv.left] = 0  # the zero left padding that forward() adds without a state
        want = conv.conv(x.transpose(1, 2).contiguous()).transpose(1, 2)
        assert (conv(x[:, conv.left:]) - want).abs().max().item() <= 1e-12, n  # the unfolded path (CPU)


@pytest.mark.parametrize("dilation", [3, 9])
def test_folded_conv_on_a_padded_window_is_the_dilated_conv(dilation):
    """What CUDA runs for a residual unit's dilated conv, chunk after chunk: _window lays out the conv's input as
    [the state's tail | SnakeBeta(x) | zero rows up to a multiple of d] (one Triton launch there) and _folded
    keeps the real outputs; together they equal the one-pass dilated conv of the activation."""
    from engine.codec.decoder import CausalConv1d, DecodeState, SnakeBeta
    from engine.codec.state import causal_window

    torch.manual_seed(dilation)
    conv = CausalConv1d(6, 5, 7, dilation=dilation).double()
    act = SnakeBeta(6).double()
    with torch.no_grad():
        act.alpha.normal_(0.0, 0.5)
        act.beta.normal_(0.0, 0.5)
    x = torch.randn(2, 50, 6, dtype=torch.float64)
    with torch.inference_mode():
        want = conv(x, act=act)  # CPU: the unfolded dilated conv, one pass
        state, outs = DecodeState(), []
        for lo, hi in ((0, 1), (1, 5), (5, 21), (21, 50)):
            window = causal_window(conv, x[:, lo:hi], conv.left, state, act, None, dilation)
            assert window.shape[1] % dilation == 0 and window.shape[1] >= conv.left + hi - lo
            outs.append(conv._folded(window, conv.conv.bias, hi - lo))
        context = torch.cat([x.new_zeros(2, conv.left, 6), act(x)], dim=1)[:, -conv.left:]
    assert (torch.cat(outs, dim=1) - want).abs().max().item() <= 1e-12
    assert torch.equal(state.tails[conv], context)  # the last `left` rows of the activated input


def test_kept_merged_weights_follow_the_parameters():
    """The transformer's merged q/k/v and gate/up weights and the quantizer's codeword tables are made once and
    kept (engine/codec/state.derived): they follow an in-place write to a parameter (load_state_dict, copy_), and a move
    or cast drops them (a released engine must not keep them in device memory)."""
    from engine.checkpoint import presets
    from engine.codec.config import CodecConfig
    from engine.codec.decoder import CodecDecoder, SnakeBeta

    torch.manual_seed(0)
    dec = CodecDecoder(CodecConfig.from_dict(presets.codec_config("tiny")).decoder).eval()
    codes = torch.randint(0, 2048, (1, 16, 5))
    with torch.no_grad():
        for p in dec.parameters():
            p.normal_(0.0, 0.05)
        before = dec(codes)
        assert "_derived" in dec.pre_transformer.layers[0].self_attn.__dict__
        assert "_derived" in dec.quantizer.rvq_rest.__dict__
        state = {k: v.clone() for k, v in dec.state_dict().items()}
        dec.pre_transformer.layers[0].self_attn.k_proj.weight.mul_(2.0)  # in place: the kept merge is stale
        dec.quantizer.rvq_rest.vq.layers[3]._codebook.cluster_usage.add_(1.0)
        changed = dec(codes)
        rebuilt = CodecDecoder(dec.cfg).eval()
        rebuilt.load_state_dict(dec.state_dict())  # nothing kept yet: made from these parameters
        assert not torch.equal(changed, before) and torch.equal(changed, rebuilt(codes))
        dec.load_state_dict(state)
        assert torch.equal(dec(codes), before)
        dec.double()
        assert not any("_derived" in m.__dict__ for m in dec.modules())
        assert all(m._params is None for m in dec.modules() if isinstance(m, SnakeBeta))
        assert (dec(codes) - before.double()).abs().max().item() < 1e-3


def test_a_loaded_engine_keeps_its_merged_weights(tiny_checkpoints):
    """The engine's decoder (built by the checkpoint loader, decoding under inference mode, as every request does)
    keeps its merged weights and codeword tables across decodes: made once, not on every call (inference-tensor
    parameters would have no version to key them on)."""
    from engine import Engine

    eng = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32")
    dec = eng.codec.decoder
    codes = torch.zeros(1, dec.cfg.num_quantizers, 3, dtype=torch.long)
    with torch.inference_mode():
        dec(codes)
        attn, group = dec.pre_transformer.layers[0].self_attn, dec.quantizer.rvq_rest
        kept = attn.__dict__["_derived"]["_qkv"][1][0], group.__dict__["_derived"]["_table"][1][0]
        dec(codes)
    assert attn.__dict__["_derived"]["_qkv"][1][0] is kept[0] and group.__dict__["_derived"]["_table"][1][0] is kept[1]
