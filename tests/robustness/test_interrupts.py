"""Interrupts: 50 runs interrupted at random frames, streaming and not, through every way the nodes wire
ComfyUI's interrupt into the engine (nodes/runner.py):

* should_stop=mm.processing_interrupted: the decode loop checks it before every frame -> GenerationInterrupted;
* on_progress -> mm.throw_exception_if_processing_interrupted: an exception raised inside the loop's callback;
* the stream consumer raising between chunks; the node then closes the generator (contextlib.closing).

After each interrupt, a fixed-seed run must equal, bit for bit, the same run made before any interrupt."""
from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest
import torch

from engine import BatchItem, Engine, Request
from engine.errors import GenerationInterrupted

FRAMES = 8
RUNS = 50


class Interrupted(Exception):
    """Stands for ComfyUI's InterruptProcessingException: a foreign exception, not an engine error."""


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    return {mt: Engine.load(tiny_checkpoints[mt], device="cpu", dtype="fp32") for mt in ("custom_voice", "base")}


@pytest.fixture(scope="module")
def requests(engines):
    t = np.arange(24000) / 24000
    ref = (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    icl = engines["base"].extract_voice(ref, 24000, ref_text="A short reference.")
    return {"custom_voice": Request(mode="custom", text="Interrupt me anywhere you like.", language="English",
                                    speaker="ryan"),
            "base": Request(mode="clone", text="A cloned voice, interrupted.", language="English", voice=icl)}


def _generate(engine, req, **kw):
    r = engine.generate(req, takes=2, seed=42, params=engine.defaults.replace(max_new_tokens=FRAMES),
                        chunk_frames=1, **kw)
    return [c.clone() for c in r.codes], r.audio.clone()


def _stream(engine, req, **kw):
    chunks = list(engine.stream(req, takes=1, seed=42, params=engine.defaults.replace(max_new_tokens=FRAMES),
                                chunk_frames=2, **kw))
    return [c.codes.clone() for c in chunks], torch.cat([c.audio for c in chunks])


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0], b[0])) and len(a[0]) == len(b[0]) and torch.equal(a[1], b[1])


def _stop_at(frame):
    """should_stop that turns True when the loop is about to make frame `frame` (checked before every frame)."""
    calls = iter(range(10**6))
    return lambda: next(calls) >= frame


def _raise_at(frame):
    def on_progress(done, total):
        if done >= frame:
            raise Interrupted()
    return on_progress


def _interrupt(engine, req, how, frame):
    """Run once with an interrupt at `frame`; returns the exception type that ended it."""
    params = engine.defaults.replace(max_new_tokens=FRAMES)
    try:
        if how == "generate/should_stop":
            _generate(engine, req, should_stop=_stop_at(frame))
        elif how == "generate/on_progress":
            _generate(engine, req, on_progress=_raise_at(max(frame, 1)))
        elif how == "batch/should_stop":
            # the items' 3 rows decode together: should_stop is asked once per batch step (FRAMES steps)
            engine.generate([BatchItem(req, takes=1, seed=1), BatchItem(req, takes=2, seed=2)], params=params,
                                  should_stop=_stop_at(frame))
        elif how == "stream/should_stop":
            _stream(engine, req, should_stop=_stop_at(frame))
        elif how == "stream/consumer":  # as nodes/runner.py: raise between chunks, closing() ends the generator
            with contextlib.closing(engine.stream(req, seed=42, params=params, chunk_frames=1)) as chunks:
                for chunk in chunks:
                    if chunk.index >= frame:
                        raise Interrupted()
        elif how == "stream/abandoned":  # a caller that just drops the generator
            gen = engine.stream(req, seed=42, params=params, chunk_frames=1)
            for chunk in gen:
                if chunk.index >= frame:
                    break
            del gen
            return "abandoned"
    except (GenerationInterrupted, Interrupted) as exc:
        return type(exc).__name__
    return "finished"


WAYS = ["generate/should_stop", "generate/on_progress", "batch/should_stop", "stream/should_stop",
        "stream/consumer", "stream/abandoned"]


def test_fifty_random_interrupts_leave_fixed_seed_output_unchanged(engines, requests, figure):
    rng = random.Random(1313)
    before = {mt: (_generate(engines[mt], requests[mt]), _stream(engines[mt], requests[mt])) for mt in engines}
    endings, mismatches = {}, []
    for i in range(RUNS):
        mt = "custom_voice" if i % 3 else "base"
        how = WAYS[i % len(WAYS)]
        frame = rng.randrange(FRAMES - 1)  # before the last frame, so the run is really cut short
        ending = _interrupt(engines[mt], requests[mt], how, frame)
        endings[ending] = endings.get(ending, 0) + 1
        check = _stream if i % 2 else _generate
        after = check(engines[mt], requests[mt])
        if not _same(after, before[mt][1 if i % 2 else 0]):
            mismatches.append((i, mt, how, frame))
        assert not engines[mt]._lock.busy, (i, how)
    figure(interrupted_runs=RUNS, endings=endings, mismatches_after=len(mismatches))
    assert endings.get("finished", 0) == 0  # every run was really interrupted
    assert mismatches == []
