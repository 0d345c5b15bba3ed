"""Reliability on the GPU (tiny checkpoints, bf16, CUDA graphs on, Triton kernels where available):

* soak: mixed generations (CustomVoice, VoiceDesign, x-vector and ICL clone; takes; streaming) keep
  allocated and reserved CUDA memory flat after warm-up;
* release: load / run / release cycles return allocated and reserved memory to the level before the load,
  and the frame and codec graphs (with their memory pools) are really freed;
* interrupts under graphs leave fixed-seed output unchanged; two threads on one engine match the sequential run.
Each test prints its figures (pytest -s)."""
from __future__ import annotations

import gc
import json
import random
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from engine import Engine, Request
from engine.errors import GenerationInterrupted

pytestmark = pytest.mark.gpu

MIB = 1 << 20
FRAMES = 6


def _load(path):
    return Engine.load(path, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", max_takes=3,
                       max_seq_len=512)


def _mem(clear_workspaces: bool = False) -> tuple[int, int]:
    gc.collect()
    torch.cuda.synchronize()
    if clear_workspaces:  # cuBLAS keeps one workspace per stream it ran on; torch's own leak check drops them too
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def _cuda_tensors() -> list:
    """Shapes of the CUDA tensors still alive (for failure messages)."""
    return [(tuple(o.shape), str(o.dtype)) for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]


def _segments() -> list:
    """The caching allocator's segments (for failure messages): (stream, pool, MiB reserved, sizes of the blocks
    still allocated in it). A segment with any live block cannot be returned to the device."""
    return [(seg["stream"], seg.get("segment_pool_id"), round(seg["total_size"] / MIB, 1),
             [b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"])
            for seg in torch.cuda.memory_snapshot()]


def _figure(**values):
    print(json.dumps(values))


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    return {mt: _load(tiny_checkpoints[mt]) for mt in ("custom_voice", "voice_design", "base")}


def _makers(engines):
    t = np.arange(int(1.5 * 24000)) / 24000
    ref = (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32)
    xvec = engines["base"].extract_voice(ref, 24000)
    icl = engines["base"].extract_voice(ref, 24000, ref_text="The reference says this.")
    return [
        lambda k: ("custom_voice", Request(mode="custom", text="Hello there, GPU.", language="English",
                                           speaker=["ryan", "vivian"][k % 2])),
        lambda k: ("voice_design", Request(mode="design", text="A designed voice.", instruct="Calm and warm.")),
        lambda k: ("base", Request(mode="clone", text="An x-vector clone.", language="English", voice=xvec)),
        lambda k: ("base", Request(mode="clone", text="An ICL clone.", language="English", voice=icl)),
    ]


def test_gpu_soak_keeps_allocated_and_reserved_memory_flat(engines):
    assert all(e.info.cuda_graphs for e in engines.values())
    makers = _makers(engines)
    generations, warm_step, samples = 240, 60, []
    for i in range(generations):
        mt, req = makers[i % 4](i // 4)
        eng, takes = engines[mt], 1 + i % 3
        params = eng.defaults.replace(max_new_tokens=FRAMES)
        if i % 3 == 2:
            for _ in eng.stream(req, takes=takes, seed=i, params=params, chunk_frames=1 + i % 2):
                pass
        else:
            res = eng.generate(req, takes=takes, seed=i, params=params)
            assert torch.isfinite(res.audio).all()
        if i % 20 == 0 or i == generations - 1:
            samples.append((i, *_mem()))
    warm = next(s for s in samples if s[0] >= warm_step)
    later = [s for s in samples if s[0] >= warm_step]
    peak_alloc, peak_res = max(s[1] for s in later), max(s[2] for s in later)
    _figure(test="gpu_soak", generations=generations, alloc_warm_mib=round(warm[1] / MIB, 1),
            alloc_peak_mib=round(peak_alloc / MIB, 1), reserved_warm_mib=round(warm[2] / MIB, 1),
            reserved_peak_mib=round(peak_res / MIB, 1))
    assert peak_alloc <= warm[1] * 1.01 + MIB, "allocated CUDA memory grows across generations"
    assert peak_res <= warm[2] * 1.05 + 16 * MIB, "reserved CUDA memory grows across generations"


def test_gpu_release_frees_graphs_pools_and_memory(tiny_checkpoints):
    base_alloc, base_res = _mem(clear_workspaces=True)
    req = Request(mode="custom", text="Load, capture, release.", language="English", speaker="ryan")
    rows = []
    for cycle in range(8):
        eng = _load(tiny_checkpoints["custom_voice"])
        params = eng.defaults.replace(max_new_tokens=FRAMES)
        eng.generate(req, takes=1 + cycle % 3, seed=cycle, params=params)
        for _ in eng.stream(req, seed=cycle, params=params, chunk_frames=2 + cycle % 2):
            pass
        loaded_alloc, loaded_res = _mem()
        graphs = [weakref.ref(eng.runner), weakref.ref(eng.codec_graphs)]
        eng.release()
        after_alloc, after_res = _mem(clear_workspaces=True)  # the engine object is still referenced, as in
        # ComfyUI's cache: release() alone must free the memory
        rows.append((cycle, loaded_alloc, loaded_res, after_alloc, after_res))
        assert [g() for g in graphs] == [None, None], "graph runners outlive release()"
        assert not [m for m in eng.talker.modules() if "_fused" in m.__dict__], "merged weights outlive release()"
        assert after_alloc <= base_alloc + MIB, (
            f"cycle {cycle}: {(after_alloc - base_alloc) / MIB:.1f} MiB still allocated after release(); "
            f"live CUDA tensors: {_cuda_tensors()[:20]}")
        assert after_res <= base_res + 2 * MIB, (
            f"cycle {cycle}: memory pools still reserved after release(); segments left: {_segments()}")
        del eng
    _figure(test="gpu_release", cycles=len(rows), base_alloc_mib=round(base_alloc / MIB, 1),
            base_reserved_mib=round(base_res / MIB, 1),
            loaded_alloc_mib=[round(r[1] / MIB, 1) for r in rows], loaded_reserved_mib=[round(r[2] / MIB, 1) for r in rows],
            after_alloc_mib=[round(r[3] / MIB, 1) for r in rows], after_reserved_mib=[round(r[4] / MIB, 1) for r in rows])


def _stop_at(frame):
    calls = iter(range(10**6))
    return lambda: next(calls) >= frame


def test_gpu_interrupts_under_graphs_leave_fixed_seed_output_unchanged(engines):
    eng = engines["custom_voice"]
    req = Request(mode="custom", text="Interrupted under CUDA graphs.", language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=12)

    def whole():
        r = eng.generate(req, takes=2, seed=9, params=params)
        return [c.clone() for c in r.codes], r.audio.clone()

    def streamed():
        return torch.cat([c.audio for c in eng.stream(req, seed=9, params=params, chunk_frames=2)])

    ref_whole, ref_stream = whole(), streamed()
    rng, mismatches = random.Random(7), 0
    for i in range(20):
        stop = _stop_at(rng.randrange(11))
        with pytest.raises(GenerationInterrupted):
            if i % 2:
                for _ in eng.stream(req, seed=9, params=params, chunk_frames=1, should_stop=stop):
                    pass
            else:
                eng.generate(req, takes=2, seed=9, params=params, should_stop=stop)
        got_codes, got_audio = whole()
        same = all(torch.equal(a, b) for a, b in zip(got_codes, ref_whole[0])) and torch.equal(got_audio, ref_whole[1])
        mismatches += not (same and torch.equal(streamed(), ref_stream))
    _figure(test="gpu_interrupts", interrupted_runs=20, mismatches_after=mismatches)
    assert mismatches == 0


def test_gpu_two_threads_match_the_sequential_run(engines):
    eng = engines["custom_voice"]
    params = eng.defaults.replace(max_new_tokens=FRAMES)
    texts = ["First thread text.", "Second thread, other text.", "Third.", "Fourth one here."]

    def job(k):
        req = Request(mode="custom", text=texts[k % 4], language="English", speaker="ryan")
        if k % 2:
            return torch.cat([c.audio for c in eng.stream(req, seed=k, params=params, chunk_frames=2)])
        return eng.generate(req, takes=1 + k % 3, seed=k, params=params).audio

    reference = [job(k) for k in range(8)]
    barrier = threading.Barrier(2)

    def worker(ks):
        barrier.wait()
        return [(k, job(k)) for k in ks]

    with ThreadPoolExecutor(2) as pool:
        results = [r for f in [pool.submit(worker, range(t, 8, 2)) for t in range(2)] for r in f.result()]
    mismatches = sum(not torch.equal(out, reference[k]) for k, out in results)
    _figure(test="gpu_threads", threads=2, calls=len(results), mismatches=mismatches)
    assert len(results) == 8 and mismatches == 0
