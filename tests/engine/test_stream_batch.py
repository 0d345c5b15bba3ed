"""Engine.stream of many requests, streamed as rows of one decode loop. Each take's chunks, joined, equal
that take of generate (a list) and of generate alone (CPU fp32: codes identical, audio within 1e-5), with
rows of different modes, prompt lengths and ends, more rows than slots, and a short first chunk. Closing
the generator early frees the engine. The codec session (one codec state per row) keeps each row's own utterance
when rows take turns on a shared graph state."""
import numpy as np
import pytest
import torch

from engine import BatchItem, Engine, Request
from engine.codec_session import CodecSession
from engine.decode import FrameChunk
from engine.errors import GenerationInterrupted, InvalidInputError
from engine.gpu.codec_graph import CodecGraphs
from tests.engine.test_batch_rows import custom_items


@pytest.fixture(scope="module")
def custom(eos_checkpoint):
    return Engine.load(eos_checkpoint, device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def base(eos_base_checkpoint):
    return Engine.load(eos_base_checkpoint, device="cpu", dtype="fp32")


def _joined(chunks, items):
    """{(item, take): (codes [T, 16], audio [T * 1920])} of the chunks; checks each take's chunk order."""
    by_take = {}
    for c in chunks:
        by_take.setdefault((c.item, c.take), []).append(c)
    assert sorted(by_take) == [(k, i) for k, item in enumerate(items) for i in range(item.takes)]
    out = {}
    for key, cs in by_take.items():
        assert [c.index for c in cs] == list(range(len(cs)))
        assert cs[-1].final and not any(c.final for c in cs[:-1]), key
        assert all(c.audio.numel() == c.codes.shape[0] * 1920 for c in cs)
        out[key] = (torch.cat([c.codes for c in cs]), torch.cat([c.audio for c in cs]))
    return out


def _check_equal(engine, items, params, joined):
    batch = engine.generate(items, params=params, max_rows=3)
    ends = []
    for k, (item, res) in enumerate(zip(items, batch)):
        alone = engine.generate(item.request, takes=item.takes, seed=item.seed, first_take=item.first_take,
                                params=params if item.max_new_tokens is None
                                else params.replace(max_new_tokens=item.max_new_tokens))
        for i in range(item.takes):
            codes, audio = joined[(k, i)]
            assert torch.equal(codes, res.codes[i]) and torch.equal(codes, alone.codes[i]), (k, i)
            n = alone.lengths[i]
            assert audio.shape[0] == n == res.lengths[i]
            if n:
                assert float((audio - alone.audio[i, :n]).abs().max()) <= 1e-5
                assert float((audio - res.audio[i, :n]).abs().max()) <= 1e-5
            ends.append(n // 1920)
    return ends


@pytest.mark.parametrize("greedy", [True, False])
def test_streamed_list_takes_equal_generate_and_alone(custom, greedy):
    params = custom.defaults.replace(max_new_tokens=30)
    params = params.greedy() if greedy else params
    items = custom_items()  # 6 rows: different speakers, languages, instructs, layouts, takes and budgets
    chunks = list(custom.stream(items, params=params, chunk_frames=3, first_chunk_frames=2, max_rows=3))
    assert (chunks[0].item, chunks[0].take, chunks[0].index) == (0, 0, 0) and chunks[0].codes.shape[0] <= 2
    assert not any(c.item == 1 for c in chunks[:1])  # only item 0 runs in the short first chunk
    ends = _check_equal(custom, items, params, _joined(chunks, items))
    assert len(set(ends)) >= 3 and min(ends) < 30, ends  # rows end at different frames, some by EOS


def test_streamed_list_clone_rows_icl_and_xvector(base):
    t = np.arange(2 * 24000) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 190 * t)).astype(np.float32)
    icl = base.extract_voice(wav, 24000, ref_text="A reference line.")
    xvec = base.extract_voice(wav[: 24000], 24000)
    items = [
        BatchItem(Request(mode="clone", text="In-context cloning of a voice.", language="English", voice=icl), seed=1),
        BatchItem(Request(mode="clone", text="Only the x-vector here.", language="English", voice=xvec), seed=2),
        BatchItem(Request(mode="clone", text="ICL again, whole text in the prompt.", language="English", voice=icl,
                          non_streaming_mode=True), takes=2, seed=3),
    ]
    params = base.defaults.greedy().replace(max_new_tokens=20)
    chunks = list(base.stream(items, params=params, chunk_frames=4, max_rows=3))
    _check_equal(base, items, params, _joined(chunks, items))


def test_early_close_and_interrupt_free_the_engine(custom):
    items = custom_items()
    params = custom.defaults.greedy().replace(max_new_tokens=30)
    gen = custom.stream(items, params=params, chunk_frames=2, max_rows=3)
    next(gen), next(gen)
    assert custom._lock.busy
    gen.close()
    assert not custom._lock.busy
    with pytest.raises(GenerationInterrupted):
        list(custom.stream(items, params=params, chunk_frames=2, should_stop=lambda: True))
    assert not custom._lock.busy
    # the engine is intact: a full run after both equals the items alone
    chunks = list(custom.stream(items[:2], params=params, chunk_frames=5))
    _check_equal(custom, items[:2], params, _joined(chunks, items[:2]))


def test_streamed_list_input_errors(custom):
    assert list(custom.stream([])) == []
    with pytest.raises(InvalidInputError, match="first_chunk_frames"):
        next(custom.stream(custom_items(), chunk_frames=4, first_chunk_frames=5))
    with pytest.raises(InvalidInputError, match="BatchItem"):
        next(custom.stream(["text"]))
    assert not custom._lock.busy


def _chunks(codes: list, joins: list, sizes: list):
    """FrameChunks of a schedule: row r holds slot r from chunk joins[r] until its codes run out."""
    return _placed_chunks(codes, list(range(len(codes))), joins, sizes, len(codes))


def _placed_chunks(codes: list, place: list, joins: list, sizes: list, slots: int) -> list:
    """FrameChunks of a slotted schedule: row r holds slot place[r] from chunk joins[r] (or, while that slot is
    held, from the chunk after its holder ends) until its codes run out."""
    pos, out = [0] * len(codes), []
    for step, k in enumerate(sizes):
        chunk_codes, valid = torch.zeros(slots, k, 16, dtype=torch.long), torch.zeros(slots, k, dtype=torch.bool)
        rows, ended = [-1] * slots, []
        for r, c in enumerate(codes):
            if step < joins[r] or pos[r] >= c.shape[0] or rows[place[r]] >= 0:
                continue
            n = min(k, c.shape[0] - pos[r])
            chunk_codes[place[r], :n], valid[place[r], :n] = c[pos[r]: pos[r] + n], True
            pos[r] += n
            rows[place[r]] = r
            if pos[r] == c.shape[0]:
                ended.append(r)
        out.append(FrameChunk(chunk_codes, valid, 0, step == len(sizes) - 1, tuple(rows), tuple(ended)))
    assert pos == [c.shape[0] for c in codes]
    return out


def _push(session, chunk, admitted: set) -> list:
    """session.push(chunk), after admitting the rows it holds for the first time (as the decode loop does)."""
    new = [(slot, r) for slot, r in enumerate(chunk.rows) if r >= 0 and r not in admitted]
    admitted.update(r for _, r in new)
    session.admit(new)
    return session.push(chunk)


@pytest.mark.parametrize("graphs", [False, True])
def test_slotted_stream_decodes_the_rows_held_as_one_batch_and_reuses_slots(base, graphs):
    """A stream's rows that join one by one (a server's) decode slotted: one codec call per chunk for every row
    held, whatever their positions, on a view of the state's first rows; a slot freed by a row that ended starts
    the next row's utterance afresh (here after an ICL reference), and each row equals its own one-pass decode.
    With graphs (run uncaptured here) the state is the shared one of a four-row bucket, wider than the two slots,
    and the views are its first one and two rows."""
    codec = base.codec
    gen = torch.Generator().manual_seed(3)
    codes = [torch.randint(0, 2048, (n, 16), generator=gen) for n in (5, 14, 9)]
    ref = torch.randint(0, 2048, (6, 16), generator=gen)
    refs = [None, None, ref]
    # (slot of each row, the chunk it joins): row 2 takes slot 0 once row 0 has ended
    chunks = _placed_chunks(codes, place=[0, 1, 0], joins=[0, 1, 2], sizes=[3, 2, 4, 4, 4], slots=2)
    assert chunks[2].rows == (2, 1)  # slot 0 reused by row 2
    cg = None
    if graphs:
        cg = CodecGraphs(codec.decoder, capture=False)
        cg.warm_buckets = (1, 4)  # as a load of four warm takes leaves it: two slots decode in the four-row state
    codec.decoder.fresh_state(1)  # the blank state's shapes, made once per decoder (its one-row decode, not counted)
    session = CodecSession(codec.decoder, cg, refs, together=False, stream=True, slots=2)
    calls = []
    hook = codec.decoder.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    out, per_chunk, admitted = [[] for _ in codes], [], set()
    try:
        for chunk in chunks:
            calls.clear()
            for r, audio, _, _ in _push(session, chunk, admitted):
                out[r].append(audio)
            per_chunk.append(list(calls))
    finally:
        hook.remove()
    session.release()
    # one codec call per chunk, on the view of the slots held (1, then 2 rows); when row 2 joins, its reference is
    # decoded on a one-row state and copied into slot 0. With graphs the first chunk's 3 frames run as pieces of 2
    # and 1; without, the private state is the decoder's blank one widened, so no decode makes its buffers
    assert per_chunk == [[1, 1] if graphs else [1], [2], [1, 2], [2], [2]]
    if graphs:
        assert set(cg.views) == {(4, 1), (4, 2)} and cg.private_streams == 0
    for r, c in enumerate(codes):
        full = c if refs[r] is None else torch.cat([refs[r], c])
        one_pass = codec.decode(full[None])[0, (0 if refs[r] is None else 6 * 1920):]
        assert float((torch.cat(out[r]) - one_pass).abs().max()) <= 1e-5, r


@pytest.mark.parametrize("graphs", [False, True])
def test_an_invariant_slotted_stream_gives_a_row_the_same_samples_beside_any_rows(base, graphs):
    """A batch invariant engine's slotted stream decodes every slot one frame at a time, so a row's samples are the
    same bit for bit alone in slot 0 of four and in slot 2 beside rows that join, end, reuse a slot and cut the
    chunks elsewhere (the default decode follows the rows held and the chunks, and rounds otherwise). With graphs
    (run uncaptured here) every decode is the four-row bucket's state itself."""
    codec = base.codec
    gen = torch.Generator().manual_seed(5)
    mine, ref = torch.randint(0, 2048, (11, 16), generator=gen), torch.randint(0, 2048, (6, 16), generator=gen)
    others = [torch.randint(0, 2048, (n, 16), generator=gen) for n in (4, 13, 7, 5)]
    codec.decoder.fresh_state(1)  # the blank state's shapes, made once per decoder (not counted)

    def served(chunks, refs, row):
        cg = None
        if graphs:
            cg = CodecGraphs(codec.decoder, capture=False)
            cg.warm_buckets = (1, 4)
        session = CodecSession(codec.decoder, cg, refs, together=False, stream=True, slots=4, invariant=True)
        calls, out, admitted = [], [], set()
        hook = codec.decoder.register_forward_hook(lambda m, args, o: calls.append(tuple(args[0].shape)))
        try:
            for chunk in chunks:
                out += [audio for r, audio, _, _ in _push(session, chunk, admitted) if r == row]
        finally:
            hook.remove()
        session.release()
        assert set(calls) - {(1, 16, 6)} == {(4, 16, 1)}  # beside the reference's one-row decode: one shape
        return torch.cat(out)

    alone = served(_placed_chunks([mine], [0], [0], [1, 2, 2, 2, 2, 2], 4), [ref], 0)
    # slot 0: a 4-frame row, then a 5-frame one with the same reference; mine joins slot 2 at the second chunk
    crowd = [others[0], others[1], mine, others[2], others[3]]
    chunks = _placed_chunks(crowd, place=[0, 1, 2, 3, 0], joins=[0, 0, 1, 2, 2], sizes=[3, 1, 4, 2, 3, 5], slots=4)
    loaded = served(chunks, [None, None, ref, None, ref], 2)
    assert torch.equal(loaded, alone)
    one_pass = codec.decode(torch.cat([ref, mine])[None])[0, 6 * 1920:]
    assert float((alone - one_pass).abs().max()) <= 1e-5


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_codec_session_keeps_each_row_utterance(base, graphs, stream):
    """Rows that start at different chunks, one with an ICL reference, each get their own utterance (the graph
    path swaps their states through the one shared one-row state, run uncaptured here): streamed pieces
    joined, or the whole audio, equal each row's one-pass decode."""
    codec = base.codec
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (n, 16), generator=gen) for n in (11, 7, 20)]
    ref = torch.randint(0, 2048, (5, 16), generator=gen)
    refs = [None, ref, None]
    cg = CodecGraphs(codec.decoder, capture=False) if graphs else None
    session = CodecSession(codec.decoder, cg, refs, together=False, stream=stream)
    out, admitted = [[] for _ in codes], set()
    for chunk in _chunks(codes, joins=[0, 1, 1], sizes=[3, 2, 4, 3, 5, 4, 3]):
        for r, audio, got_codes, final in _push(session, chunk, admitted):
            out[r].append(audio)
    wav = [torch.cat(o) for o in out] if stream else session.finish()
    session.release()
    for r, c in enumerate(codes):
        full = c if refs[r] is None else torch.cat([refs[r], c])
        one_pass = codec.decode(full[None])[0, (0 if refs[r] is None else 5 * 1920):]
        assert wav[r].shape == one_pass.shape
        assert float((wav[r] - one_pass).abs().max()) <= 1e-5, r
    if graphs:  # the one-row state is free again for the next call
        owner = CodecSession(codec.decoder, cg, [None], together=True, stream=False)
        assert owner.groups[-1].shared and cg.private_streams == 0


def test_a_slotted_session_starts_a_row_when_the_loop_admits_it(base):
    """A slotted stream starts a row's utterance in its slot when the loop admits it (decode_rows' on_admit), so
    the first chunk's push only decodes: the reference's one-row decode ran at admission. A row pushed without
    being admitted is an error of the caller, never a late start."""
    codec = base.codec
    gen = torch.Generator().manual_seed(9)
    codes, ref = torch.randint(0, 2048, (5, 16), generator=gen), torch.randint(0, 2048, (6, 16), generator=gen)
    chunks = _placed_chunks([codes], [0], [0], [2, 3], 2)
    codec.decoder.fresh_state(1)
    session = CodecSession(codec.decoder, None, [ref], together=False, stream=True, slots=2)
    calls = []
    hook = codec.decoder.register_forward_hook(lambda m, args, o: calls.append(tuple(args[0].shape)))
    try:
        session.admit([(0, 0)])
        assert calls == [(1, 16, 6)]  # the reference, decoded on a one-row state, copied into slot 0
        calls.clear()
        audio = [a for chunk in chunks for _, a, _, _ in session.push(chunk)]
        assert calls == [(1, 16, 2), (1, 16, 3)]
    finally:
        hook.remove()
    session.release()
    one_pass = codec.decode(torch.cat([ref, codes])[None])[0, 6 * 1920:]
    assert float((torch.cat(audio) - one_pass).abs().max()) <= 1e-5
    late = CodecSession(codec.decoder, None, [None], together=False, stream=True, slots=2)
    with pytest.raises(RuntimeError, match="admitted"):
        late.push(chunks[0])
    late.release()
