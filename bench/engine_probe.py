"""Bench helpers that reach into a loaded engine (the benches put the project root on sys.path first):

  * load_captured: the engine as the node loads it (random real-size CustomVoice checkpoint), with the frame
    graphs of the given takes counts captured by one short request each;
  * seat: a batch bucket's frame state put at a cache position, every row live with no frame budget, so its
    graphs can be replayed from there;
  * codec_after_frames: the whole-utterance codec decoded after the last frame instead of beside the frames;
  * script_params: the sampling settings of a request of exactly `frames` frames (EOS is disabled);
  * request_wall_s: the host seconds of one whole request of exactly `frames` frames;
  * before_graphs: a callback at the point of Engine.load where the weights are in and the graphs begin;
  * node_load_kwargs: Engine.load's arguments as the loader node passes them for a max_takes;
  * node_generate: what a generator node runs for a one-segment line.
"""
from __future__ import annotations

import contextlib
import time

from gpu_bench import TEXT, checkpoint

CAPTURE_TEXT = "A short line to capture the graphs."
NO_FLUSH = 1 << 30  # codec_overlap.FLUSH_FRAMES that no request reaches


def load_captured(size: str, takes=(1,)):
    from engine import Engine, Request

    eng = Engine.load(checkpoint(size), device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    req = Request(mode="custom", text=CAPTURE_TEXT, language="English", speaker="ryan")
    for n in takes:
        eng.generate(req, takes=n, params=eng.defaults.replace(max_new_tokens=8, min_new_tokens=8))
    return eng


def seat(runner, batch: int, pos: int):
    """The runner's state of `batch` rows, made current and put at position pos (stream-ordered, no sync)."""
    s = runner.s = runner._state(batch)
    s.pos.fill_(pos)
    s.t.zero_()
    s.limit.fill_(1 << 30)
    s.finished.zero_()
    return s


@contextlib.contextmanager
def codec_after_frames():
    """No side-stream codec pieces while the frames run: every frame waits, as one run, for the end."""
    from engine.gpu import codec_overlap

    flush = codec_overlap.FLUSH_FRAMES
    codec_overlap.FLUSH_FRAMES = NO_FLUSH
    try:
        yield
    finally:
        codec_overlap.FLUSH_FRAMES = flush


def script_params(eng, frames: int):
    return eng.defaults.replace(max_new_tokens=frames, min_new_tokens=min(eng.defaults.min_new_tokens, frames))


def request_wall_s(eng, takes: int, frames: int) -> float:
    """Host seconds of one Engine.generate of the bench text (seed 0, `takes` takes) of exactly `frames` frames,
    timed from a synchronised GPU to the audio on the host."""
    import torch

    from engine import Request

    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=frames, min_new_tokens=frames)
    torch.cuda.synchronize()
    t = time.perf_counter()
    eng.generate(req, takes=takes, seed=0, params=params)
    return time.perf_counter() - t


def before_graphs(fn) -> None:
    """Call fn() each time Engine.load has read the weights and starts its graphs (wraps Engine._enable_graphs;
    for the load benches, which import `engine` from the tree under test before calling this)."""
    from engine.engine import Engine

    enable = Engine._enable_graphs

    def wrapped(self, *args, **kwargs):
        fn()
        return enable(self, *args, **kwargs)

    Engine._enable_graphs = wrapped


def node_load_kwargs(engine_cls, max_takes: int) -> dict:
    """What nodes/engine_cache.py passes Engine.load for the loader's max_takes: that many takes, their graphs
    captured at load (warm_takes; a tree from before it gets max_takes only, and captures at first use)."""
    import inspect

    kw = {"max_takes": max_takes}
    if "warm_takes" in inspect.signature(engine_cls.load).parameters:
        kw["warm_takes"] = max_takes
    return kw


def node_generate(eng, req, takes: int, seed: int, params):
    """What a generator node runs for a one-segment line (nodes/runner.py Job.generate, without ComfyUI's
    progress bar): generate_batch of one item, then its AUDIO (results_audio: a tree from d650cc2 on)."""
    from engine import BatchItem
    from nodes.audio_utils import results_audio  # no ComfyUI imports

    res = eng.generate([BatchItem(req, takes=takes, seed=seed)], params=params)[0]
    results_audio([res], eng.sample_rate, {"node": "bench", "seed": seed, "first_take": 0})
    return res
