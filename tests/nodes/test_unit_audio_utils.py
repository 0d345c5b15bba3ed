"""AUDIO/take helpers and click-free segment joining (nodes/audio_utils.py)."""
import pytest
import torch

from tests.support._q3support import load_pure

au = load_pure("audio_utils")


def batch(lengths, t=None):
    t = t or max(lengths)
    wav = torch.randn(len(lengths), t)
    return au.make_audio(wav, lengths)


def test_make_audio_shape_padding_and_lengths():
    a = batch([100, 60, 80])
    assert a["waveform"].shape == (3, 1, 100) and a["waveform"].dtype == torch.float32
    assert a["sample_rate"] == 24000 and a[au.LENGTHS_KEY] == [100, 60, 80]
    assert torch.all(a["waveform"][1, 0, 60:] == 0)


def test_make_audio_copies_unless_given_the_waveform():
    wav = torch.ones(2, 10)
    a = au.make_audio(wav, [10, 4])
    assert torch.all(wav == 1) and a["waveform"].data_ptr() != wav.data_ptr()  # the caller's tensor untouched
    b = au.make_audio(wav, [10, 4], copy=False)  # an engine result, handed over: no copy of the audio
    assert b["waveform"].data_ptr() == wav.data_ptr() and torch.all(b["waveform"][1, 0, 4:] == 0)
    with torch.inference_mode():
        result = torch.ones(2, 10)  # what the engine returns, handed over outside inference mode
    d = au.make_audio(result, [10, 4], copy=False)
    assert d["waveform"].data_ptr() == result.data_ptr() and torch.all(d["waveform"][1, 0, 4:] == 0)
    c = au.make_audio(torch.ones(2, 10, dtype=torch.float64), [10, 4], copy=False)  # converted: new memory anyway
    assert c["waveform"].dtype == torch.float32 and torch.all(c["waveform"][1, 0, 4:] == 0)


def test_results_audio_joins_the_segments_without_copying_one():
    class Res:
        def __init__(self, audio, lengths):
            self.audio, self.lengths = audio, lengths

    one = Res(torch.ones(2, 10), [10, 6])
    a = au.results_audio([one], 24000, {"node": "X", "seed": 1, "first_take": 0})
    assert a["waveform"].data_ptr() == one.audio.data_ptr() and a[au.LENGTHS_KEY] == [10, 6]
    assert torch.all(a["waveform"][1, 0, 6:] == 0) and au.take_origin(a, 1)["take"] == 1
    segments = [one, Res(torch.ones(2, 8), [8, 8])]
    two = au.results_audio(segments, 24000)
    wav, lengths = au.join_segments([(r.audio, list(r.lengths)) for r in segments], 24000)
    assert two[au.LENGTHS_KEY] == lengths and torch.equal(two["waveform"][:, 0], wav)


def test_make_audio_rejects_inconsistent_lengths():
    with pytest.raises(ValueError):
        au.make_audio(torch.zeros(2, 10), [10])
    with pytest.raises(ValueError):
        au.make_audio(torch.zeros(2, 10), [10, 11])


def test_pick_take_trims_padding():
    a = batch([100, 60])
    p = au.pick_take(a, 1)
    assert p["waveform"].shape == (1, 1, 60)
    assert torch.equal(p["waveform"][0, 0], a["waveform"][1, 0, :60])
    with pytest.raises(IndexError):
        au.pick_take(a, 2)


def test_origin_follows_the_picked_take():
    a = au.make_audio(torch.randn(3, 20), [20, 20, 20], origin={"node": "CustomVoice", "seed": 42, "first_take": 5})
    assert [au.take_origin(a, i) for i in range(3)] == [{"node": "CustomVoice", "seed": 42, "take": t}
                                                       for t in (5, 6, 7)]
    p = au.pick_take(a, 2)  # a single take: first_take is the take that renders it alone
    assert p[au.ORIGIN_KEY] == {"node": "CustomVoice", "seed": 42, "first_take": 7}
    assert au.take_origin(p, 0)["take"] == 7
    plain = batch([10, 10])
    assert au.ORIGIN_KEY not in plain and au.take_origin(plain, 1) is None
    assert au.ORIGIN_KEY not in au.pick_take(plain, 1)


def test_foreign_audio_without_lengths_uses_full_length():
    a = {"waveform": torch.zeros(2, 2, 50), "sample_rate": 44100}
    assert au.take_lengths(a) == [50, 50]
    assert au.batch_item(a, 1).shape == (2, 50)
    a[au.LENGTHS_KEY] = [10, 99]  # inconsistent -> ignored
    assert au.take_lengths(a) == [50, 50]


def test_single_segment_join_is_identity():
    wav = torch.randn(2, 30)
    out, lengths = au.join_segments([(wav, [30, 20])])
    assert out is wav and lengths == [30, 20]


def _segments(n_takes, seg_lengths):
    g = torch.Generator().manual_seed(0)
    segs = []
    for lens in seg_lengths:
        w = torch.randn(n_takes, max(lens), generator=g) * 0.5 + 0.5  # non-zero at the edges
        for i, n in enumerate(lens):
            w[i, n:] = 0
        segs.append((w, lens))
    return segs


def test_join_is_click_free_with_gap():
    segs = _segments(2, [[4800, 4000], [2400, 3000]])
    out, lengths = au.join_segments(segs)
    gap, fade = round(24000 * au.GAP_S), round(24000 * au.FADE_S)
    assert lengths == [4800 + gap + 2400, 4000 + gap + 3000]
    x = out[0]
    assert abs(float(x[4799])) < 0.01 * abs(float(segs[0][0][0, 4799])) + 1e-3  # faded out
    assert torch.all(x[4800:4800 + gap] == 0)
    assert abs(float(x[4800 + gap])) < 0.01  # faded in
    assert torch.equal(x[:4800 - fade], segs[0][0][0, :4800 - fade])  # untouched outside the fades


def test_stream_joiner_matches_join_segments_exactly():
    seg_lengths = [[5000], [100], [3000]]  # includes a segment shorter than two fades
    segs = _segments(1, seg_lengths)
    ref, lengths = au.join_segments(segs)
    j = au.StreamJoiner(len(segs))
    pieces = []
    for wav, (n,) in segs:
        x = wav[0, :n]
        for start in range(0, n, 777):
            pieces.append(j.push(x[start:start + 777]))
        pieces.append(j.end_segment())
    got = torch.cat(pieces)
    assert got.numel() == lengths[0]
    assert torch.equal(got, ref[0, : lengths[0]])


def test_stream_joiner_single_segment_passthrough():
    j = au.StreamJoiner(1)
    x = torch.randn(100)
    assert torch.equal(j.push(x), x) and j.end_segment().numel() == 0


def test_play_order_holds_later_segments_and_joins_like_join_segments():
    """Rows of one stream arrive interleaved: segment 1's audio goes out as it comes, segment 2's (and 3's)
    only once every earlier segment has ended, and everything sent equals join_segments of the segments."""
    from types import SimpleNamespace

    seg_lengths = [[3000], [2000], [1500]]
    segs = _segments(1, seg_lengths)
    ref, lengths = au.join_segments(segs)
    parts = [[wav[0, i:i + 700] for i in range(0, n, 700)] for wav, (n,) in segs]
    arrival = []  # round robin over the segments still running, as rows of one batch
    while any(parts):
        for k, p in enumerate(parts):
            if p:
                arrival.append(SimpleNamespace(item=k, audio=p.pop(0), final=not p))
    sent_at = []  # (arrival index, sent samples)
    for i, (chunk, ready) in enumerate(au.play_order(arrival, len(segs))):
        assert chunk is arrival[i]
        sent_at += [(i, x) for x in ready]
    got = torch.cat([x for _, x in sent_at])
    assert got.numel() == lengths[0] and torch.equal(got, ref[0, : lengths[0]])
    end_of_first = max(i for i, c in enumerate(arrival) if c.item == 0)
    before = sum(x.numel() for i, x in sent_at if i < end_of_first)
    assert before <= 3000  # nothing of a later segment went out before segment 1 ended
