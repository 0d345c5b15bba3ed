"""The decode loop's frames launched ahead of each chunk's host sync (decode_rows(ahead=k)): the chunks it
yields, their rows, ends and progress counts are exactly those of the loop without it, on rows that end by
EOS at different frames, by their budget, and with more rows than slots (a slot whose row has ended holds
filler that may differ: its row stepped on before the host knew). It costs at most `ahead` frames a run (and
never more than a chunk or the budget left), launched ahead of a chunk that turned out to be the last, and
dropped."""
import pytest
import torch

from engine import Engine, Request
from engine.decode import EagerFrames, Row, decode_rows
from tests.support.decoding import decode_frames
from engine.gpu.frame_graph import GraphedFrames


@pytest.fixture(scope="module")
def engine(eos_checkpoint):
    return Engine.load(eos_checkpoint, device="cpu", dtype="fp32")


class Counted(EagerFrames):
    """The eager runner, counting the frames it is asked for."""

    def __init__(self, talker):
        super().__init__(talker)
        self.frames = 0

    def next_frame(self, host):
        self.frames += 1
        return super().next_frame(host)


def _req(text="Rows end where their sampling says so.", speaker="ryan"):
    return Request(mode="custom", text=text, language="English", speaker=speaker)


def _chunks(runner, make, **kw):
    counts = []
    out = [(c.codes.clone(), c.valid.clone(), c.start, c.done, c.rows, c.ended)
           for c in make(runner, on_frames=lambda done, total: counts.append((done, total)), **kw)]
    return out, counts


def _assert_same(a, b):
    (chunks_a, counts_a), (chunks_b, counts_b) = a, b
    assert len(chunks_a) == len(chunks_b)
    for x, y in zip(chunks_a, chunks_b):
        assert torch.equal(x[1], y[1])  # the same frames are real speech ...
        assert torch.equal(x[0][x[1]], y[0][y[1]])  # ... with the same codes (a slot whose row ended holds filler)
        assert x[2:] == y[2:]
    assert counts_a == counts_b


def _takes(engine, takes, seed, frames, chunk, first=0):
    params = engine.defaults.replace(max_new_tokens=frames)
    prompt, params, max_frames = engine.prepare(_req(), takes, params)

    def make(runner, **kw):
        return decode_frames(runner, prompt, takes=takes, seed=seed, params=params, max_frames=max_frames,
                             eos_id=engine.cfg.talker.codec_eos_id, chunk_frames=chunk, first_chunk_frames=first,
                             prelaunch=True, **kw)
    return make


@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_takes_same_chunks_with_frames_ahead(engine, ahead):
    """Takes that end by EOS at different frames (and one run per chunk size): same chunks, and the frames
    launched ahead are dropped at most once a run, only when every take ended by EOS inside a chunk."""
    dropped = budget_end = 0
    # (seed 18: one take ends by EOS at frame 4, the other by its budget; 20: a take runs out its budget)
    for seed, takes, chunk, first in [(21, 4, 4, 0), (21, 4, 3, 2), (18, 2, 4, 0), (20, 1, 4, 0), (13, 4, 4, 2),
                                      (7, 1, 4, 0), (8, 1, 5, 2), (12, 4, 4, 0), (10, 3, 1, 0)]:
        make = _takes(engine, takes, seed, 30, chunk, first)
        plain, runner = Counted(engine.talker), Counted(engine.talker)
        base = _chunks(plain, make, ahead=0)
        _assert_same(base, _chunks(runner, make, ahead=ahead))
        extra = runner.frames - plain.frames
        last = base[0][-1]
        ran = last[2] + last[0].shape[1]  # frames stepped in all
        by_budget = ran == 30
        # dropped: the next chunk's first frames, as many as asked, fit in a chunk and in the budget left
        assert extra == (0 if by_budget else min(ahead, chunk, 30 - ran)), (seed, takes, chunk, ran, extra)
        dropped += extra
        budget_end += by_budget
    assert dropped and budget_end, "both ends (every take by EOS, a take by its budget) must be exercised"


@pytest.mark.parametrize("ahead", [1, 2])
def test_rows_more_than_slots_same_chunks_with_frames_ahead(engine, ahead):
    """Continuous admission: no frame goes ahead while a row waits for a slot, and the chunks are the same."""
    params = engine.defaults.replace(max_new_tokens=24)
    rows = []
    for k, (text, speaker) in enumerate([("A short one.", "ryan"), ("Another line of text.", "vivian"),
                                         ("The third row waits for a slot.", "ryan"), ("And a fourth.", "vivian")]):
        prompt, _, frames = engine.prepare(_req(text, speaker), 1, params)
        rows.append(Row(prompt, 300 + k, frames - 3 * k))

    def make(runner, **kw):
        return decode_rows(runner, rows, slots=2, params=params, eos_id=engine.cfg.talker.codec_eos_id,
                           chunk_frames=4, prelaunch=True, **kw)

    plain, runner = Counted(engine.talker), Counted(engine.talker)
    base = _chunks(plain, make, ahead=0)
    _assert_same(base, _chunks(runner, make, ahead=ahead))
    assert 0 <= runner.frames - plain.frames <= ahead
    # the CUDA-graph runner's frame body, run uncaptured: its finished flags are read the same way
    _assert_same(base, _chunks(GraphedFrames(engine.talker, engine.config.max_seq_len, capture=False), make, ahead=ahead))
    assert sorted(r for c in base[0] for r in c[5]) == [0, 1, 2, 3]


@pytest.mark.parametrize("ahead", [0, 2])
def test_rows_are_told_admitted_before_their_first_chunk_and_after_the_chunks_before_it(engine, ahead):
    """decode_rows(on_admit=...) names each row with its slot exactly once: before the first chunk that holds it
    is handed on, and after every chunk made before it joined (those chunks' codec decode covers its slot's view,
    so the codec session must not start its state earlier). Rows join at the start, while a chunk is read (a
    short first chunk admits the lead row first) and once a slot is freed."""
    params = engine.defaults.replace(max_new_tokens=20)
    rows = []
    for k, text in enumerate(["The lead row.", "Joins while the first chunk is read.", "Waits for a free slot.",
                              "And the last one."]):
        prompt, _, frames = engine.prepare(_req(text), 1, params)
        rows.append(Row(prompt, 500 + k, frames - 4 * k))
    events = []
    for chunk in decode_rows(EagerFrames(engine.talker), rows, slots=3, params=params,
                             eos_id=engine.cfg.talker.codec_eos_id, chunk_frames=4, first_chunk_frames=1,
                             lead_rows=1, prelaunch=True, ahead=ahead,
                             on_admit=lambda pairs: events.append(("admit", list(pairs)))):
        events.append(("chunk", chunk.rows))
    told = {}
    for i, (kind, what) in enumerate(events):
        if kind == "admit":
            for slot, r in what:
                assert r not in told
                told[r] = (slot, i)
            continue
        for slot, r in enumerate(what):
            if r >= 0:
                assert told[r][0] == slot
                # no chunk was handed on between its admission and its first chunk
                first = next(j for j, (k, w) in enumerate(events) if k == "chunk" and r in w)
                assert not any(k == "chunk" for k, _ in events[told[r][1]: first])
    assert sorted(told) == [0, 1, 2, 3]
    assert events[0] == ("admit", [(0, 0)]) and events[1][0] == "chunk" and events[1][1][1:] == (-1, -1)
