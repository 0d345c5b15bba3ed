"""Concurrency: 2-4 threads share one engine. Calls are serialised inside the engine (engine/engine_lock.py),
so every concurrent result equals the sequential one; callers that cannot be served get EngineBusyError."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine import BatchItem, Engine, Request
from engine.errors import EngineBusyError

FRAMES = 6


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32")


def _req(text="Two callers share one engine.", speaker="ryan"):
    return Request(mode="custom", text=text, language="English", speaker=speaker)


def _params(engine, frames=FRAMES):
    return engine.defaults.replace(max_new_tokens=frames)


def _jobs(engine):
    """(name, call) pairs; each call returns (codes per take, audio per take) for exact comparison."""
    p = _params(engine)

    def gen(seed, takes, text):
        def call():
            r = engine.generate(_req(text), takes=takes, seed=seed, params=p)
            return [c.clone() for c in r.codes], [r.audio[i, :n].clone() for i, n in enumerate(r.lengths)]
        return call

    def stream(seed, chunk, text):
        def call():
            chunks = list(engine.stream(_req(text), takes=1, seed=seed, params=p, chunk_frames=chunk))
            codes = torch.cat([c.codes[0] for c in chunks])
            audio = torch.cat([c.audio for c in chunks])
            return [codes], [audio]
        return call

    def batch(seed):
        def call():
            items = [BatchItem(_req("First item."), takes=1, seed=seed),
                     BatchItem(_req("Second item, another speaker.", "vivian"), takes=2, seed=seed + 1)]
            res = engine.generate(items, params=p)
            return ([c for r in res for c in r.codes],
                    [r.audio[i, :n] for r in res for i, n in enumerate(r.lengths)])
        return call

    texts = ["Hello there.", "A second sentence, a little longer.", "Short.", "Numbers: one, two, three."]
    jobs = []
    for k in range(12):
        text = texts[k % len(texts)]
        kind = k % 3
        if kind == 0:
            jobs.append((f"generate{k}", gen(100 + k, 1 + k % 2, text)))
        elif kind == 1:
            jobs.append((f"stream{k}", stream(200 + k, 2 + k % 3, text)))
        else:
            jobs.append((f"batch{k}", batch(300 + k)))
    return jobs


def _same(a, b) -> bool:
    (ca, wa), (cb, wb) = a, b
    return (len(ca) == len(cb) and all(torch.equal(x, y) for x, y in zip(ca, cb))
            and all(torch.equal(x, y) for x, y in zip(wa, wb)))


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_threads_sharing_an_engine_match_the_sequential_run(engine, threads, figure):
    jobs = _jobs(engine)
    reference = {name: call() for name, call in jobs}
    start = threading.Barrier(threads)

    def worker(my_jobs):
        start.wait()  # all threads hit the engine at the same moment
        return [(name, call()) for name, call in my_jobs]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(worker, jobs[i::threads]) for i in range(threads)]
        results = [r for f in futures for r in f.result()]
    wall = time.perf_counter() - t0
    mismatches = [name for name, out in results if not _same(out, reference[name])]
    figure(threads=threads, calls=len(results), mismatches=len(mismatches), wall_s=round(wall, 2))
    assert len(results) == len(jobs)
    assert mismatches == []
    assert not engine._lock.busy


def test_a_call_from_inside_an_open_stream_is_refused_and_the_stream_goes_on(engine):
    p = _params(engine)
    whole = engine.generate(_req(), seed=7, params=p)
    expected = torch.cat([c.audio for c in engine.stream(_req(), seed=7, params=p, chunk_frames=2)])
    gen = engine.stream(_req(), seed=7, params=p, chunk_frames=2)
    first = next(gen)
    with pytest.raises(EngineBusyError, match="stream"):  # same thread: at once, no deadlock
        engine.generate(_req("Another request."), seed=1, params=p)
    rest = list(gen)
    assert torch.equal(torch.cat([c.audio for c in [first, *rest]]), expected)
    assert torch.equal(engine.generate(_req(), seed=7, params=p).audio, whole.audio)


def test_a_callback_calling_the_engine_again_is_refused(engine):
    p = _params(engine)

    def reenter(done, total):
        engine.generate(_req(), seed=1, params=p)

    with pytest.raises(EngineBusyError, match="generate"):
        engine.generate(_req(), seed=1, params=p, on_progress=reenter)
    assert not engine._lock.busy
    engine.generate(_req(), seed=1, params=p)


def test_another_thread_waits_for_an_unfinished_stream_then_gets_engine_busy(engine, monkeypatch):
    monkeypatch.setattr(engine, "busy_timeout_s", 0.3)
    p = _params(engine)
    expected = engine.generate(_req(), seed=3, params=p).audio
    gen = engine.stream(_req(), seed=3, params=p, chunk_frames=2)
    next(gen)  # started, then left unfinished while still referenced

    def other():
        try:
            return engine.generate(_req(), seed=3, params=p).audio
        except EngineBusyError as exc:
            return exc

    with ThreadPoolExecutor(1) as pool:
        err = pool.submit(other).result()
    assert isinstance(err, EngineBusyError) and "stream" in str(err) and "closed" in str(err)
    gen.close()  # an explicit close frees the engine at once
    with ThreadPoolExecutor(1) as pool:
        assert torch.equal(pool.submit(other).result(), expected)

    gen = engine.stream(_req(), seed=3, params=p, chunk_frames=2)
    next(gen)
    del gen  # dropping the last reference closes the generator too
    with ThreadPoolExecutor(1) as pool:
        assert torch.equal(pool.submit(other).result(), expected)


def test_a_waiting_thread_runs_as_soon_as_the_holder_finishes(engine):
    p = _params(engine, 12)
    started = threading.Event()
    order = []

    def long_stream():
        for i, _ in enumerate(engine.stream(_req(), seed=5, params=p, chunk_frames=1)):
            if i == 0:
                started.set()
        order.append("stream")

    def short_call():
        started.wait()
        engine.generate(_req(), seed=6, params=_params(engine, 2))
        order.append("generate")

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(long_stream), pool.submit(short_call)]:
            f.result()
    assert order == ["stream", "generate"]  # the second caller waited; it did not cut into the stream
