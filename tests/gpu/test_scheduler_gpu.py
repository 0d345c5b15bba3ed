"""The scheduler under CUDA graphs (skipped without CUDA): requests of other lengths, takes, speakers and
sampling settings, joining a loop that runs, each equal the same request generated alone (fp32: codes identical,
audio within 1e-4), with the Triton kernels off and on (the sampler reads each row's settings), the codec on
views of its state's first rows captured when the scheduler started; a cancel frees rows for the next request,
and afterwards direct calls run with nothing captured late."""
import pytest
import torch

from engine import Engine, Request, Scheduler
from engine.errors import GenerationInterrupted

pytestmark = pytest.mark.gpu


def _req(text, speaker="ryan", language="English", **kw):
    return Request(mode="custom", text=text, language=language, speaker=speaker, **kw)


def _engine(path, triton):
    if triton == "on":
        from engine import kernels

        ok, why = kernels.available("cuda")
        if not ok:
            pytest.skip(why)
    return Engine.load(path, device="cuda", dtype="fp32", cuda_graphs="on", triton=triton, max_seq_len=512,
                       max_takes=4, warm_takes=4)


def _joined(ticket, taken=()):
    out = {}
    for c in [*taken, *ticket]:
        codes, audio = out.setdefault(c.take, ([], []))
        codes.append(c.codes)
        audio.append(c.audio)
    return {k: (torch.cat(c), torch.cat(a)) for k, (c, a) in out.items()}


@pytest.mark.parametrize("triton", ["off", "on"])
def test_requests_under_load_equal_each_alone_under_graphs(eos_checkpoint, triton):
    e = _engine(eos_checkpoint, triton)
    assert e.info.cuda_graphs
    p = e.defaults.replace(max_new_tokens=120)
    jobs = [(_req("A long first line, still speaking while the others come and go."), 2, 1, p),
            (_req("Short one.", speaker="vivian"), 1, 2, p.greedy()),
            (_req("Ein deutscher Satz.", language="German"), 1, 3, p.replace(temperature=1.3, top_p=0.8)),
            (_req("Takes with an instruction.", instruct="Speak slowly."), 3, 4,
             p.replace(subtalker_dosample=False, top_k=4, repetition_penalty=1.4)),
            (_req("One more, the defaults."), 1, 5, p)]
    late = e.runner.late_captures
    with Scheduler(e, max_rows=4, chunk_frames=4) as s:
        # the scheduler captured the codec's views of its state's first 1 and 2 rows when it started
        assert {k[:2] for k in e.codec_graphs.view_graphs} == {(4, 1), (4, 2)}
        codec_late = e.codec_graphs.late_captures
        tickets = [s.submit(req, takes=n, seed=seed, params=params, first_chunk_frames=2)
                   for req, n, seed, params in jobs[:2]]
        first = next(iter(tickets[0]))
        tickets += [s.submit(req, takes=n, seed=seed, params=params) for req, n, seed, params in jobs[2:]]
        joined = [_joined(t, [first] if k == 0 else []) for k, t in enumerate(tickets)]
    assert first.codes.shape[0] <= 2 and max(t.admitted_at for t in tickets) > 0
    for (req, n, seed, params), got in zip(jobs, joined):
        alone = e.generate(req, takes=n, seed=seed, params=params)
        for i in range(n):
            codes, audio = got[i]
            assert torch.equal(codes, alone.codes[i]), f"{req.text!r} take {i}"
            m = alone.lengths[i]
            assert audio.shape[0] == m
            if m:
                assert float((audio - alone.audio[i, :m]).abs().max()) <= 1e-4
    assert e.runner.late_captures == late and e.codec_graphs.late_captures == codec_late


def test_cancel_under_graphs_frees_rows(tiny_checkpoints):
    e = _engine(tiny_checkpoints["custom_voice"], "off")  # EOS off: rows run their whole budget
    p = e.defaults.replace(max_new_tokens=200)
    with Scheduler(e, max_rows=2, chunk_frames=4) as s:
        long = s.submit(_req("Long."), takes=2, seed=1, params=p)
        later = s.submit(_req("Next."), seed=2, params=p.replace(max_new_tokens=12))
        next(iter(long))
        long.cancel()
        got = _joined(later)
        assert later.admitted_at == long.cancelled_at + 1  # admitted at the boundary that freed the rows
        with pytest.raises(GenerationInterrupted):
            next(iter(long))
    assert not e._lock.busy
    alone = e.generate(_req("Next."), seed=2, params=p.replace(max_new_tokens=12))
    assert torch.equal(got[0][0], alone.codes[0])


@pytest.mark.parametrize("triton", ["off", "on"])
def test_sixty_four_rows_equal_each_alone(eos_checkpoint, triton):
    """The largest row bucket: 26 requests of 1 to 4 takes (63 rows) fill a 64-row loop together, and each
    request still equals itself generated alone."""
    if triton == "on":
        from engine import kernels

        ok, why = kernels.available("cuda")
        if not ok:
            pytest.skip(why)
    e = Engine.load(eos_checkpoint, device="cuda", dtype="fp32", cuda_graphs="on", triton=triton, max_seq_len=256,
                    max_takes=64, warm_takes=64)
    p = e.defaults.replace(max_new_tokens=60)
    speakers = ("ryan", "vivian")
    jobs = [(_req(f"Line {i} of the crowd, {'short' if i % 3 else 'a little longer than the others'}.",
                  speaker=speakers[i % 2]), 1 + i % 4, 100 + i, p if i % 5 else p.greedy()) for i in range(26)]
    assert sum(n for _, n, _, _ in jobs) == 63
    late, codec_late = e.runner.late_captures, e.codec_graphs.late_captures
    with Scheduler(e, max_rows=64, chunk_frames=4, max_queue=64) as s:
        tickets = [s.submit(req, takes=n, seed=seed, params=params) for req, n, seed, params in jobs]
        joined = [_joined(t) for t in tickets]
        assert s.stats()["slots"] == 64
    for (req, n, seed, params), got in zip(jobs, joined):
        alone = e.generate(req, takes=n, seed=seed, params=params)
        for i in range(n):
            assert torch.equal(got[i][0], alone.codes[i]), f"{req.text!r} take {i}"
    assert e.runner.late_captures == late and e.codec_graphs.late_captures == codec_late


def test_few_rows_in_a_large_loop_replay_the_nested_graph(eos_checkpoint):
    """A 64-slot loop holding one request steps only its rows (the nested graph of the rows held), and the
    request still equals itself alone; more requests grow the graph."""
    from engine import kernels

    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)
    e = Engine.load(eos_checkpoint, device="cuda", dtype="fp32", cuda_graphs="on", triton="on", max_seq_len=256,
                    max_takes=64, warm_takes=64)
    assert {b for b, _ in e.runner.nested} == {64} and len(e.runner.nested) == 6
    p = e.defaults.replace(max_new_tokens=40)
    seen = []
    real = e.runner.next_frame

    def next_frame(host):
        out = real(host)
        seen.append(e.runner.stepped)
        return out

    e.runner.next_frame = next_frame
    with Scheduler(e, max_rows=64, chunk_frames=4) as s:
        one = _joined(s.submit(_req("Alone in a large loop."), takes=2, seed=9, params=p))
        # its two rows' nested graph; one row's once the take in the second slot has ended (EOS comes per take)
        assert seen[0] == 2 and set(seen) <= {1, 2}
        tickets = [s.submit(_req(f"Crowd line {i}."), takes=3, seed=20 + i, params=p) for i in range(4)]
        crowd = [_joined(t) for t in tickets]
    assert max(seen) == 16
    del e.runner.next_frame
    alone = e.generate(_req("Alone in a large loop."), takes=2, seed=9, params=p)
    for i in range(2):
        assert torch.equal(one[i][0], alone.codes[i])
    for i, got in enumerate(crowd):
        ref = e.generate(_req(f"Crowd line {i}."), takes=3, seed=20 + i, params=p)
        for k in range(3):
            assert torch.equal(got[k][0], ref.codes[k]), f"crowd {i} take {k}"
