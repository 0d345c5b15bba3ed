"""Bench helpers that reach into the engine (the benches put the project root on sys.path first):

  * script_params: the sampling settings of a request of exactly `frames` frames (EOS is disabled);
  * before_graphs: a callback at the point of Engine.load where the weights are in and the graphs begin;
  * node_load_kwargs: Engine.load's arguments as the loader node passes them for a max_takes;
  * node_generate: what a generator node runs for a one-segment line.
"""
from __future__ import annotations


def script_params(eng, frames: int):
    return eng.defaults.capped(frames)


def before_graphs(fn) -> None:
    """Call fn() each time Engine.load has read the weights and starts its graphs (wraps the loader's
    _enable_graphs; for the load benches, which import `engine` from the tree under test before calling this)."""
    from engine import loading

    enable = loading._enable_graphs

    def wrapped(*args, **kwargs):
        fn()
        return enable(*args, **kwargs)

    loading._enable_graphs = wrapped


def node_load_kwargs(engine_cls, max_takes: int) -> dict:
    """What the loader node's EngineConfig holds for its max_takes: that many takes, their graphs captured at
    load (warm_takes)."""
    return {"max_takes": max_takes, "warm_takes": max_takes}


def node_generate(eng, req, takes: int, seed: int, params):
    """What a generator node runs for a one-segment line (nodes/runner.py Job.generate, without ComfyUI's
    progress bar): generate of a one-item list, then its AUDIO."""
    from engine import BatchItem
    from nodes.audio_utils import results_audio  # no ComfyUI imports

    res = eng.generate([BatchItem(req, takes=takes, seed=seed)], params=params)[0]
    results_audio([res], eng.sample_rate, {"node": "bench", "seed": seed, "first_take": 0})
    return res
