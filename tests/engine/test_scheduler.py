"""The scheduler (engine/scheduler.py) on CPU with tiny random checkpoints: a request served under load (other
requests of other lengths, takes, speakers, languages, layouts, voices and sampling, arriving before and while
it runs) equals the same request generated alone with the same seed; cancel frees rows at the next chunk
boundary; a full queue refuses; requests are admitted first come, first served; close() ends everything."""
import asyncio

import numpy as np
import pytest
import torch

from engine import BatchItem, Engine, Request, Scheduler
from engine.errors import (
    GenerationInterrupted,
    InvalidInputError,
    QueueFullError,
    SchedulerClosedError,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def custom(eos_checkpoint):
    return Engine.load(eos_checkpoint, device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def no_eos(tiny_checkpoints):
    """EOS off: every row runs its whole budget, so a request is still running when the test acts on it."""
    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32")


def _custom(text, speaker="ryan", language="English", **kw):
    return Request(mode="custom", text=text, language=language, speaker=speaker, **kw)


def _collect(ticket, taken=()) -> dict:
    """take -> (codes [frames, 16], audio [samples], chunks) of a ticket's whole stream (`taken`: chunks
    already taken from it)."""
    parts = {}
    for chunk in [*taken, *ticket]:
        parts.setdefault(chunk.take, []).append(chunk)
    assert sorted(parts) == list(range(ticket.takes))
    out = {}
    for take, chunks in parts.items():
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
        out[take] = (torch.cat([c.codes for c in chunks]), torch.cat([c.audio for c in chunks]), chunks)
    return out


def _assert_equals_alone(engine, job, got):
    what, kw = job
    if isinstance(what, BatchItem):
        params = kw.get("params") or engine.defaults
        if what.max_new_tokens is not None:
            params = params.replace(max_new_tokens=what.max_new_tokens)
        alone = engine.generate(what.request, takes=what.takes, seed=what.seed, first_take=what.first_take,
                                params=params)
    else:
        alone = engine.generate(what, takes=kw.get("takes", 1), seed=kw.get("seed", 0),
                                first_take=kw.get("first_take", 0), params=kw.get("params"))
    assert len(got) == len(alone.codes)
    for take, (codes, audio, _) in got.items():
        assert torch.equal(codes, alone.codes[take]), f"take {take} of {job}"
        n = alone.lengths[take]
        assert audio.shape[0] == n
        if n:
            assert float((audio - alone.audio[take, :n]).abs().max()) <= 1e-5
    return [c.shape[0] for c, _, _ in got.values()]


def test_requests_under_load_equal_each_alone(custom):
    p = custom.defaults.replace(max_new_tokens=30)
    before = [
        (_custom("A long first line, so that it is still speaking while the others come and go."),
         {"takes": 2, "seed": 1, "params": p}),
        (_custom("Short one.", speaker="vivian"), {"seed": 2, "params": p.greedy()}),
        (BatchItem(_custom("Ein deutscher Satz.", language="German"), takes=2, seed=3, first_take=2,
                   max_new_tokens=9), {"params": p.replace(temperature=1.3, top_p=0.8)}),
    ]
    during = [
        (_custom("Auto language, streaming layout.", language="auto", non_streaming_mode=False),
         {"seed": 4, "params": p.replace(repetition_penalty=1.5, min_new_tokens=6)}),
        (_custom("Takes with an instruction.", instruct="Speak slowly."),
         {"takes": 3, "seed": 5, "params": p.replace(subtalker_dosample=False, top_k=4)}),
        (_custom("One more, the defaults."), {"seed": 6}),
    ]
    with Scheduler(custom, max_rows=4, chunk_frames=3) as s:
        tickets = [s.submit(what, **kw) for what, kw in before]
        first = next(iter(tickets[0]))  # the loop runs: the next requests join it
        tickets += [s.submit(what, **kw) for what, kw in during]
        results = [_collect(t, [first] if k == 0 else []) for k, t in enumerate(tickets)]
        stats = s.stats()
        assert (stats["waiting"], stats["running"], stats["rows"]) == (0, 0, 0)
    frames = [_assert_equals_alone(custom, job, got) for job, got in zip(before + during, results)]
    joined = [t.admitted_at for t in tickets]
    assert joined[0] == 0 and max(joined) > 0, joined  # some requests joined a loop that was running
    assert len({n for f in frames for n in f}) >= 4 and min(min(f) for f in frames) < 30, frames  # EOS ends rows


def test_clone_requests_under_load_equal_each_alone(eos_base_checkpoint):
    """Rows with other voices: ICL references (each row's codec decodes after its own reference) beside
    x-vector voices, in one loop."""
    base = Engine.load(eos_base_checkpoint, device="cpu", dtype="fp32")
    t = np.arange(2 * 24000) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 190 * t)).astype(np.float32)
    icl = base.extract_voice(wav, 24000, ref_text="A reference line.")
    other = base.extract_voice(wav[::-1].copy(), 24000, ref_text="Another reference.")
    xvec = base.extract_voice(wav[:24000], 24000)
    p = base.defaults.replace(max_new_tokens=20)
    jobs = [(Request(mode="clone", text="In-context cloning of a voice.", language="English", voice=icl),
             {"takes": 2, "seed": 1, "params": p}),
            (Request(mode="clone", text="Only the x-vector here.", language="English", voice=xvec),
             {"seed": 2, "params": p.greedy()}),
            (Request(mode="clone", text="Another reference voice.", language="English", voice=other,
                     non_streaming_mode=True), {"seed": 3, "params": p}),
            (Request(mode="clone", text="Un autre texte.", language="French", voice=icl),
             {"takes": 2, "seed": 4, "params": p.replace(temperature=0.6)})]
    with Scheduler(base, max_rows=3, chunk_frames=4) as s:
        results = [_collect(t) for t in [s.submit(what, **kw) for what, kw in jobs]]
    for job, got in zip(jobs, results):
        _assert_equals_alone(base, job, got)


def test_cancel_frees_rows_at_the_next_boundary(no_eos):
    p = no_eos.defaults.replace(max_new_tokens=200)
    with Scheduler(no_eos, max_rows=2, chunk_frames=2) as s:
        long = s.submit(_custom("Long."), takes=2, seed=1, params=p)
        job = (_custom("Waits for the rows the first one holds."), {"seed": 2, "params": p.replace(max_new_tokens=6)})
        later = s.submit(job[0], **job[1])
        queued = s.submit(_custom("Given up while it waits."), seed=3)
        next(iter(long))
        assert later.admitted_at is None  # every row is taken
        queued.cancel()
        assert s.stats()["waiting"] == 1  # out of the queue at once
        long.cancel()
        got = _collect(later)
        assert later.admitted_at == long.cancelled_at + 1  # admitted at the boundary that freed the rows
        with pytest.raises(GenerationInterrupted, match="cancelled"):
            next(iter(long))
        with pytest.raises(GenerationInterrupted):
            next(iter(queued))
        assert queued.admitted_at is None and long.cancelled and long.done
        assert s.stats()["rows"] == 0
    assert _assert_equals_alone(no_eos, job, got) == [6]


def test_full_queue_refuses_and_direct_calls_run_between(no_eos):
    """While a direct stream() holds the engine the scheduler waits and its queue fills: past max_queue,
    submit() refuses. Once the stream ends the queued requests run; then the engine is free for direct calls."""
    p = no_eos.defaults.replace(max_new_tokens=4)
    with Scheduler(no_eos, max_rows=2, max_queue=2, chunk_frames=2) as s:
        direct = no_eos.stream(_custom("A direct call holds the engine."), params=p, chunk_frames=2)
        next(direct)
        queued = [s.submit(_custom(f"Queued {k}."), seed=k, params=p) for k in range(2)]
        with pytest.raises(QueueFullError, match="retry later"):
            s.submit(_custom("One too many."), params=p)
        assert s.stats()["waiting"] == 2
        direct.close()
        for t in queued:
            assert [c.shape[0] for c, _, _ in _collect(t).values()] == [4]
        s.submit(_custom("Room again."), params=p)  # the queue has room once they ran
    assert no_eos.generate(_custom("Direct again."), params=p).lengths == [4 * 1920]


def test_first_come_first_served(no_eos):
    """Requests join in submission order; a request whose takes need every row waits at the head and the
    small ones behind it do not pass it (no starvation)."""
    p = no_eos.defaults.replace(max_new_tokens=6)
    with Scheduler(no_eos, max_rows=3, chunk_frames=2) as s:
        shapes = [1, 2, 1, 3, 1, 1, 2, 1]  # takes; the 3-take request needs every row
        tickets = [s.submit(_custom(f"Request {k}."), takes=n, seed=k,
                            params=p.replace(max_new_tokens=4 + 2 * (k % 3))) for k, n in enumerate(shapes)]
        for t in tickets:
            _collect(t)
        firsts = [t.admitted_at for t in tickets]
    assert firsts == sorted(firsts), firsts
    big = shapes.index(3)
    assert firsts[big] > firsts[big - 1] and firsts[big + 1] > firsts[big]  # it waited, and nothing passed it


def test_close_ends_queued_and_running_requests(no_eos):
    p = no_eos.defaults.replace(max_new_tokens=200)
    s = Scheduler(no_eos, max_rows=1, chunk_frames=2)
    running = s.submit(_custom("Runs until the scheduler closes."), params=p)
    waiting = s.submit(_custom("Never gets a row."), params=p)
    next(iter(running))
    s.close()
    for t in (running, waiting):
        with pytest.raises(SchedulerClosedError, match="closed"):
            list(t)
    with pytest.raises(SchedulerClosedError):
        s.submit(_custom("Too late."))
    s.close()  # twice is fine
    assert no_eos.generate(_custom("The engine is free."), params=p.replace(max_new_tokens=3)).lengths == [3 * 1920]


def test_a_loop_that_dies_ends_its_requests_and_refuses_more(no_eos):
    """Should the loop's thread meet an error outside the decode loop (pinning its device, say), its requests
    end with that error and submit() refuses, rather than every caller waiting on a thread that is gone."""
    s = Scheduler(no_eos, max_rows=1, chunk_frames=2)

    def broken():
        raise RuntimeError("no device here")

    s._hold_engine = broken
    ticket = s.submit(_custom("Never decodes."))
    with pytest.raises(SchedulerClosedError, match="no device here"):
        list(ticket)
    with pytest.raises(SchedulerClosedError):
        s.submit(_custom("Refused."))
    s.close()
    assert no_eos.generate(_custom("The engine is free."), params=no_eos.defaults.replace(max_new_tokens=3)).lengths \
        == [3 * 1920]


def test_async_iteration_and_chunk_sizes(no_eos):
    """`async for` gives the same chunks as `for`; a first chunk of first_chunk_frames, then chunks that gather
    twice the frames of the one before, up to the request's chunk_frames (the listener holds more audio than the
    next chunk takes to make), and the rest at the end."""
    p = no_eos.defaults.replace(max_new_tokens=21)
    req = _custom("Streamed to an event loop.")

    async def consume(ticket):
        return [c async for c in ticket]

    with Scheduler(no_eos, max_rows=2, chunk_frames=2) as s:
        chunks = asyncio.run(consume(s.submit(req, seed=9, params=p, chunk_frames=8, first_chunk_frames=1)))
        plain = list(s.submit(req, seed=9, params=p))
    assert [c.codes.shape[0] for c in chunks] == [1, 2, 4, 8, 6]
    assert [c.codes.shape[0] for c in plain] == [2] * 10 + [1]
    assert torch.equal(torch.cat([c.codes for c in chunks]), torch.cat([c.codes for c in plain]))
    assert torch.equal(torch.cat([c.codes for c in plain]), no_eos.generate(req, seed=9, params=p).codes[0])


def test_event_loop_callers_hand_work_to_two_threads_of_the_scheduler(no_eos, monkeypatch):
    """submit_async builds every prompt in one thread of the scheduler's, run_beside runs in one other (on a GPU,
    each thread that runs a matmul keeps a cuBLAS workspace for good, so a pool that grows would grow the
    memory); after close() both refuse with SchedulerClosedError."""
    import threading

    threads = []
    real = no_eos.prepare

    def prepare(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(no_eos, "prepare", prepare)
    p = no_eos.defaults.replace(max_new_tokens=3)

    async def callers(s):
        tickets = await asyncio.gather(*(s.submit_async(_custom(f"Caller {i}."), seed=i, params=p) for i in range(6)))
        for t in tickets:
            [c async for c in t]
        return await asyncio.gather(*(s.run_beside(lambda: threading.current_thread().name) for _ in range(3)))

    with Scheduler(no_eos, max_rows=2, chunk_frames=2) as s:
        beside = asyncio.run(callers(s))
    assert len(threads) == 6 and len(set(threads)) == 1 and threads[0].startswith("qwen3tts-prompts")
    assert len(set(beside)) == 1 and beside[0].startswith("qwen3tts-beside")
    for call in (lambda: s.submit_async(_custom("Too late.")), lambda: s.run_beside(print)):
        with pytest.raises(SchedulerClosedError):
            asyncio.run(call())


def test_bad_submissions_raise_at_once(no_eos):
    with Scheduler(no_eos, max_rows=2, chunk_frames=4) as s:
        with pytest.raises(InvalidInputError, match="speaker"):
            s.submit(_custom("x", speaker="nobody"))
        with pytest.raises(InvalidInputError, match="max_rows"):
            s.submit(_custom("x"), takes=3)
        with pytest.raises(InvalidInputError, match="first_chunk_frames"):
            s.submit(_custom("x"), first_chunk_frames=5)
        with pytest.raises(InvalidInputError, match="BatchItem"):
            s.submit(BatchItem(_custom("x")), seed=3)
        assert s.stats()["waiting"] == 0
    with pytest.raises(InvalidInputError, match="max_queue"):
        Scheduler(no_eos, max_queue=0)


def test_graph_frame_body_under_the_scheduler(eos_checkpoint):
    """The graph runner's frame body, run uncaptured on the CPU, under the scheduler: rows of other settings take
    over slots that other settings held (its [slots] settings tables), a cancelled row stops (retire), and every
    request that ran to its end equals itself generated alone on the eager runner."""
    from engine.gpu.frame_graph import GraphedFrames

    eager = Engine.load(eos_checkpoint, device="cpu", dtype="fp32")
    graph = Engine.load(eos_checkpoint, device="cpu", dtype="fp32")
    graph.runner = GraphedFrames(graph.talker, graph.config.max_seq_len, capture=False)
    p = graph.defaults.replace(max_new_tokens=24)
    jobs = [(_custom("Sampled, two takes."), {"takes": 2, "seed": 1, "params": p}),
            (_custom("Greedy.", speaker="vivian"), {"seed": 2, "params": p.greedy()}),
            (_custom("Hot and narrow."), {"seed": 3, "params": p.replace(temperature=1.5, top_p=0.7, top_k=0)}),
            (_custom("Penalised, late EOS."), {"seed": 4, "params": p.replace(repetition_penalty=1.7,
                                                                               min_new_tokens=10)}),
            (_custom("Predictor greedy."), {"takes": 2, "seed": 5, "params": p.replace(subtalker_dosample=False)})]
    with Scheduler(graph, max_rows=3, chunk_frames=3) as s:
        gone = s.submit(_custom("Cancelled after its first chunk."), takes=2, seed=9, params=p.greedy())
        tickets = [s.submit(what, **kw) for what, kw in jobs]
        next(iter(gone))
        gone.cancel()
        results = [_collect(t) for t in tickets]
    assert gone.cancelled and len({t.admitted_at for t in tickets}) >= 3
    assert graph.runner.views  # frames with fewer rows held than slots stepped only those (FrameState.head)
    for job, got in zip(jobs, results):
        _assert_equals_alone(eager, job, got)


def test_few_rows_in_many_slots_step_only_their_own(eos_checkpoint):
    """A 16-slot loop holding three rows steps a view of its first four (FrameState.head, what the nested graphs
    replay on the GPU), and each request equals itself generated alone."""
    from engine.gpu.frame_graph import GraphedFrames

    eager = Engine.load(eos_checkpoint, device="cpu", dtype="fp32")
    graph = Engine.load(eos_checkpoint, device="cpu", dtype="fp32")
    graph.runner = runner = GraphedFrames(graph.talker, graph.config.max_seq_len, capture=False)
    stepped, real = [], runner.next_frame

    def next_frame(host):
        out = real(host)
        stepped.append(runner.stepped)
        return out

    runner.next_frame = next_frame
    p = graph.defaults.replace(max_new_tokens=20)
    jobs = [(_custom("Two takes of one line."), {"takes": 2, "seed": 1, "params": p}),
            (_custom("And one more.", speaker="vivian"), {"seed": 2, "params": p.replace(temperature=1.2)})]
    with Scheduler(graph, max_rows=16, chunk_frames=2) as s:
        results = [_collect(s.submit(what, **kw)) for what, kw in jobs]
    assert runner.s.batch == 16 and stepped and max(stepped) <= 4 and min(stepped) >= 1
    for job, got in zip(jobs, results):
        _assert_equals_alone(eager, job, got)


def test_the_eager_runner_steps_only_the_slots_up_to_the_highest_held(custom):
    """In a 16-slot loop the eager runner steps the slots up to the highest one held (a lone request: one row,
    not 16), reports the slots past them as no frame, and each request still equals itself generated alone."""
    widths, real = [], custom.talker.forward_hidden

    def forward_hidden(embeds, cache, start):
        if embeds.shape[1] == 1:  # a frame's step (a prefill is many positions of one row)
            widths.append((embeds.shape[0], cache.batch))
        return real(embeds, cache, start)

    p = custom.defaults.replace(max_new_tokens=16)
    jobs = [(_custom("A lone line."), {"seed": 1, "params": p}),
            (_custom("Then two takes.", speaker="vivian"), {"takes": 2, "seed": 2, "params": p})]
    custom.talker.forward_hidden = forward_hidden
    try:
        with Scheduler(custom, max_rows=16, chunk_frames=4) as s:
            results = [_collect(s.submit(what, **kw)) for what, kw in jobs]  # one after the other
    finally:
        del custom.talker.forward_hidden
    assert widths and {w for w, _ in widths} == {1, 2} and all(w == b for w, b in widths)
    for job, got in zip(jobs, results):
        _assert_equals_alone(custom, job, got)


@pytest.mark.parametrize("graph", [False, True])
def test_a_row_given_up_ends_at_that_boundary(no_eos, graph):
    """decode_rows with a source that gives row 0 up after its second chunk: the row ends in that chunk, its slot
    stops as a finished (empty) one, and the row waiting for a slot takes it at the same boundary."""
    from engine.decode import EagerFrames, Row, decode_rows
    from engine.gpu.frame_graph import GraphedFrames
    from engine.row_source import FixedRows

    class GivesUp(FixedRows):
        boundaries = 0

        def dropped(self):
            self.boundaries += 1
            return {0} if self.boundaries == 2 else set()

    p = no_eos.defaults.replace(max_new_tokens=30)
    rows = []
    for k, text in enumerate(["Given up.", "Runs on.", "Waits for a slot."]):
        prompt, _, frames = no_eos.prepare(_custom(text), 1, p)
        rows.append(Row(prompt, k, frames))
    runner = GraphedFrames(no_eos.talker, no_eos.config.max_seq_len, capture=False) if graph \
        else EagerFrames(no_eos.talker)
    seen = []
    for chunk in decode_rows(runner, GivesUp(rows), slots=2, params=p, eos_id=no_eos.cfg.talker.codec_eos_id,
                             chunk_frames=3):
        seen.append((chunk.rows, chunk.ended, int(chunk.valid[0].sum())))
        if len(seen) == 2:
            assert chunk.ended == (0,) and bool(runner.finished[0])  # stopped, before the next row is admitted
    assert seen[1] == ((0, 1), (0,), 3) and seen[2][0] == (2, 1)
    assert sum(v for held, _, v in seen if held[0] == 0) == 6  # its frames end with the chunk it was given up in


def test_many_callers_with_cancels_leave_nothing_behind(custom):
    """Four threads submit 24 requests of random takes, lengths, speakers and sampling (retrying while the queue
    is full); some cancel after a chunk, some at once. Every request that ran to its end equals itself
    generated alone, and once the last cancelled rows have left, the scheduler holds no row, ticket or
    reference."""
    import random
    import threading
    import time

    p = custom.defaults.replace(max_new_tokens=16)
    settings = [p, p.greedy(), p.replace(temperature=1.2, top_k=10), p.replace(top_p=0.7)]
    done, errors = [], []

    def caller(k):
        rng = random.Random(k)
        for n in range(6):
            seed = 10 * k + n
            job = (_custom(f"Caller {k}, line {n}" + " more" * rng.randrange(4),
                           speaker=rng.choice(["ryan", "vivian"])),
                   {"takes": rng.choice([1, 1, 2]), "seed": seed, "params": rng.choice(settings)})
            while True:
                try:
                    ticket = s.submit(job[0], **job[1])
                    break
                except QueueFullError:
                    time.sleep(0.05)
            fate = rng.random()
            try:
                if fate < 0.15:
                    ticket.cancel()  # most likely still waiting
                elif fate < 0.35:
                    for i, _ in enumerate(ticket):
                        if i == 1:
                            ticket.cancel()
                            break
                else:
                    done.append((job, _collect(ticket)))
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

    with Scheduler(custom, max_rows=4, max_queue=3, chunk_frames=2) as s:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 30
        while s.stats()["running"] and time.monotonic() < deadline:  # cancelled rows leave at the next boundary
            time.sleep(0.01)
        stats = s.stats()
        assert (stats["waiting"], stats["running"], stats["rows"]) == (0, 0, 0)
        assert not (s._rows or s._refs or s._owner or s._live or s._dropped)
    assert errors == []
    assert len(done) >= 12
    for job, got in done:
        _assert_equals_alone(custom, job, got)
