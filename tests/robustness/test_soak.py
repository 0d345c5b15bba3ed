"""Soak in one process, CPU, tiny checkpoints.

* 300 generations mixing CustomVoice, VoiceDesign, x-vector and ICL clone, 1-3 takes, whole and streamed;
* 50 load/release cycles through the node-side engine cache (nodes/engine_cache.py), half released by the
  pack, half by ComfyUI's own unload (the "Free model and node cache" path);
* RSS and open file descriptors sampled along the way (after gc.collect()): after warm-up, RSS may not grow
  by more than 5 % and the descriptor count must stay flat.

QWEN3TTS_SOAK=long runs ten times as many generations and cycles with longer outputs (opt-in; see
docs/RELIABILITY.md for its figures)."""
from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest

from engine import Engine, Request
from tests.support import comfy_inproc
from tests.support._q3support import need
from tests.support.procstats import open_fds, rss_mb

LONG = os.environ.get("QWEN3TTS_SOAK") == "long"
GENERATIONS = 3000 if LONG else 300
CYCLES = 500 if LONG else 50
FRAMES = 12 if LONG else 3
RSS_GROWTH = 0.05


def _sample(samples, step):
    gc.collect()
    samples.append((step, rss_mb(), open_fds()))


def _check(samples, warm_step):
    """(RSS at warm-up, largest RSS after it, growth, fds at warm-up, largest fd count after it)."""
    warm = next(s for s in samples if s[0] >= warm_step)
    later = [s for s in samples if s[0] >= warm_step]
    peak_rss = max(s[1] for s in later)
    peak_fds = max(s[2] for s in later)
    return warm[1], peak_rss, peak_rss / warm[1] - 1, warm[2], peak_fds


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    return {mt: Engine.load(tiny_checkpoints[mt], device="cpu", dtype="fp32", max_takes=3)
            for mt in ("custom_voice", "voice_design", "base")}


def _requests(engines):
    t = np.arange(int(1.5 * 24000)) / 24000
    ref = (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    xvec = engines["base"].extract_voice(ref, 24000)
    icl = engines["base"].extract_voice(ref, 24000, ref_text="The reference says this.")
    texts = ["Hello there.", "A somewhat longer sentence, with a comma.", "Numbers: 1, 2, 3.", "Short."]
    return [
        lambda k: ("custom_voice", Request(mode="custom", text=texts[k % 4], language="English",
                                           speaker=["ryan", "vivian", "serena"][k % 3])),
        lambda k: ("voice_design", Request(mode="design", text=texts[k % 4], language="Auto",
                                           instruct="A calm and warm voice." if k % 2 else "Fast, bright.")),
        lambda k: ("base", Request(mode="clone", text=texts[k % 4], language="English", voice=xvec)),
        lambda k: ("base", Request(mode="clone", text=texts[k % 4], language="English", voice=icl)),
    ]


def test_soak_generations_keep_memory_and_fds_flat(engines, figure):
    makers = _requests(engines)
    samples, frames_made, streamed = [], 0, 0
    warm_step = GENERATIONS // 3  # RSS settles within ~100 generations (allocator pools, tokenizer caches)
    t0 = time.perf_counter()
    for i in range(GENERATIONS):
        mt, req = makers[i % 4](i // 4)
        eng = engines[mt]
        takes = 1 + i % 3
        params = eng.defaults.replace(max_new_tokens=FRAMES)
        if i % 3 == 2:
            chunks = list(eng.stream(req, takes=takes, seed=i, params=params, chunk_frames=1 + i % 2))
            frames_made += sum(c.codes.shape[0] for c in chunks)
            streamed += 1
        else:
            res = eng.generate(req, takes=takes, seed=i, params=params)
            frames_made += sum(c.shape[0] for c in res.codes)
            assert np.isfinite(res.audio.numpy()).all()
        if i % 25 == 0 or i == GENERATIONS - 1:
            _sample(samples, i)
    wall = time.perf_counter() - t0
    warm, peak, growth, warm_fds, peak_fds = _check(samples, warm_step)
    figure(generations=GENERATIONS, streamed=streamed, frames=frames_made, wall_s=round(wall, 1),
           rss_start_mb=round(samples[0][1], 1), rss_warm_mb=round(warm, 1), rss_peak_after_warm_mb=round(peak, 1),
           rss_growth_pct=round(100 * growth, 2), fds_warm=warm_fds, fds_peak_after_warm=peak_fds)
    assert growth <= RSS_GROWTH, f"RSS grew {100 * growth:.1f} % after warm-up ({warm:.0f} -> {peak:.0f} MB)"
    assert peak_fds <= warm_fds, f"open fds grew from {warm_fds} to {peak_fds}"


def test_soak_load_release_cycles_through_the_node_cache(tiny_checkpoints, figure):
    need(comfy_inproc.comfy_missing())
    with comfy_inproc.engine_cache() as (mm, cache):
        _cycles(mm, cache, tiny_checkpoints, figure)


def _cycles(mm, cache, tiny_checkpoints, figure):
    keys = [cache.EngineConfig(model_dir=str(tiny_checkpoints[mt]), device="cpu", dtype="fp32", cuda_graphs="auto",
                            triton="auto", max_takes=2) for mt in ("custom_voice", "voice_design")]
    reqs = [Request(mode="custom", text="Load, speak, release.", speaker="ryan"),
            Request(mode="design", text="Load, speak, release.", instruct="A clear voice.")]
    samples = []
    warm_step = CYCLES // 5
    t0 = time.perf_counter()
    for i in range(CYCLES):
        k = i % 2
        eng = cache.acquire(keys[k])
        eng.generate(reqs[k], seed=i, params=eng.defaults.replace(max_new_tokens=2))
        del eng
        if i % 4 < 2:
            assert cache.release(keys[k], reason="soak")
        else:  # ComfyUI unloads it: the patcher's ON_DETACH releases the engine
            mm.unload_all_models()
        assert cache.loaded() == [], cache.loaded()
        if i % 5 == 0 or i == CYCLES - 1:
            _sample(samples, i)
    wall = time.perf_counter() - t0
    warm, peak, growth, warm_fds, peak_fds = _check(samples, warm_step)
    figure(cycles=CYCLES, wall_s=round(wall, 1), rss_warm_mb=round(warm, 1), rss_peak_after_warm_mb=round(peak, 1),
           rss_growth_pct=round(100 * growth, 2), fds_warm=warm_fds, fds_peak_after_warm=peak_fds)
    assert growth <= RSS_GROWTH, f"RSS grew {100 * growth:.1f} % after warm-up ({warm:.0f} -> {peak:.0f} MB)"
    assert peak_fds <= warm_fds, f"open fds grew from {warm_fds} to {peak_fds}"
