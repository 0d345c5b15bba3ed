"""Bench helpers that reach into the engine (the benches put the project root on sys.path first):

  * script_params: the sampling settings of a request of exactly `frames` frames (EOS is disabled);
  * before_graphs: a callback at the point of Engine.load where the weights are in and the graphs begin;
  * node_load_kwargs: Engine.load's arguments as the loader node passes them for a max_takes;
  * node_generate: what a generator node runs for a one-segment line.
"""
from __future__ import annotations


def script_params(eng, frames: int):
    return eng.defaults.replace(max_new_tokens=frames, min_new_tokens=min(eng.defaults.min_new_tokens, frames))


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
    progress bar): generate_batch of one item, then its AUDIO."""
    from engine import BatchItem
    from nodes.audio_utils import results_audio  # no ComfyUI imports

    res = eng.generate([BatchItem(req, takes=takes, seed=seed)], params=params)[0]
    results_audio([res], eng.sample_rate, {"node": "bench", "seed": seed, "first_take": 0})
    return res
