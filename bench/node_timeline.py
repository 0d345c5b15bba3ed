"""Where the node path's request overhead goes, request by request: host clock, GPU clock and the OS.

    python bench/node_timeline.py [--takes 4] [--variant default|threads1] [--out FILE.json]

Loads a real-size random 0.6B CustomVoice checkpoint as the loader node does (max_takes = warm_takes =
--takes), runs the real-length script once in a fresh process as a generator node does (generate_batch of
one item, then results_audio), and stamps each request by wrapping the engine's own steps (no engine change):
  * host: the rows prepared, the prefill launched, each chunk's arrival, the loop's end, the audio on the
    host, generate_batch's return and the AUDIO made;
  * GPU (CUDA events): the request's start, the prefill's end, the last frame, the audio ready;
  * the main thread's own counters (getrusage RUSAGE_THREAD): CPU seconds, minor page faults, voluntary and
    involuntary context switches; and Python's collections (timing.GcPauses).
A request whose overhead spikes then shows whether the host computed (CPU time), faulted pages, was
preempted (involuntary switches), or waited for a GPU that was slow (GPU spans). Overhead is the
real-length benchmark's: wall - frames x steady ms a frame, the steady figure measured the same way after
the script (real_length_bench._steady). `--variant threads1` sets torch.set_num_threads(1) first.
"""
from __future__ import annotations

import argparse
import collections
import json
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_probe import node_generate, node_load_kwargs, script_params
from gpu_bench import checkpoint
from real_length_bench import SPEAKER, STEADY_TEXT, _steady
from real_length_script import script
from timing import GcPauses, percentile


def thread_usage() -> dict:
    u = resource.getrusage(resource.RUSAGE_THREAD)
    return {"cpu_ms": 1000 * (u.ru_utime + u.ru_stime), "minflt": u.ru_minflt, "nvcsw": u.ru_nvcsw,
            "nivcsw": u.ru_nivcsw}


class Probe:
    def __init__(self):
        self.prof = None  # a cProfile.Profile run from each request's start to its first admission (--cprofile)
        self.reset()

    def reset(self):
        self.host, self.events, self.chunks = {}, {}, []

    def mark(self, name, event=False):
        self.host[name] = time.perf_counter()
        if event:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events[name] = e


def install(probe: Probe) -> None:
    import engine.decode as D
    import engine.engine as E
    import nodes.audio_utils as A
    from engine.gpu import codec_overlap

    batch_rows, admit, touching = E.Engine._batch_rows, D._admit, E.touching
    finish, slots_to_audio = codec_overlap.OverlappedDecode.finish, E.Engine._slots_to_audio

    def _batch_rows(self, *a, **k):
        out = batch_rows(self, *a, **k)
        probe.mark("rows")
        return out

    def _admit(*a, **k):
        first = "admitted" not in probe.host
        if first:
            probe.mark("admit_start")  # after the runner's open()
        out = admit(*a, **k)
        if first:
            probe.mark("admitted", event=True)
            if probe.prof is not None:
                probe.prof.disable()
        return out

    def _touching(chunks, hosts):
        for chunk in touching(chunks, hosts):
            probe.chunks.append(time.perf_counter())
            yield chunk

    def _finish(self):
        probe.mark("finish", event=True)  # every frame is queued on the main stream before this
        out = finish(self)
        probe.mark("audio_queued", event=True)
        return out

    def _slots_to_audio(self, *a, **k):
        out = slots_to_audio(self, *a, **k)
        probe.mark("audio_host")
        return out

    results_audio = A.results_audio

    def _results_audio(*a, **k):  # engine_probe.node_generate: generate_batch has returned
        probe.mark("returned")
        return results_audio(*a, **k)

    A.results_audio = _results_audio
    E.Engine._batch_rows, D._admit, E.touching = _batch_rows, _admit, _touching
    codec_overlap.OverlappedDecode.finish, E.Engine._slots_to_audio = _finish, _slots_to_audio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--takes", type=int, default=4)
    ap.add_argument("--variant", default="default", choices=["default", "threads1"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cprofile", default=None,
                    help="FILE: profile the host from each script request's start to its prefill (the rows made, the "
                         "runner opened, the admission), print the top functions and write the stats to FILE")
    args = ap.parse_args()
    if args.variant == "threads1":
        torch.set_num_threads(1)

    from engine import Engine, Request

    torch.zeros(1, device="cuda")
    t = time.perf_counter()
    eng = Engine.load(checkpoint("0.6b"), device="cuda", dtype="bf16", cuda_graphs="on", triton="auto",
                      **node_load_kwargs(Engine, args.takes))
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t
    probe = Probe()
    install(probe)
    if args.cprofile:
        import cProfile

        probe.prof = cProfile.Profile()

    def node_line(text, lang, frames, seed):
        req = Request(mode="custom", text=text, language=lang, speaker=SPEAKER)
        return node_generate(eng, req, args.takes, seed, script_params(eng, frames))

    rows = []
    pauses = GcPauses().__enter__()  # collections in each request, to the end of the process
    for i, (lang, text, frames) in enumerate(script()):
        probe.reset()
        u0 = thread_usage()
        t0 = time.perf_counter()
        probe.mark("start", event=True)
        if probe.prof is not None:
            probe.prof.enable()
        res = node_line(text, lang, frames, i)
        t1 = time.perf_counter()
        u1 = thread_usage()
        torch.cuda.synchronize()
        h, ev = probe.host, probe.events
        gpu = {k: ev["start"].elapsed_time(e) for k, e in ev.items()}
        gaps = [1000 * (b - a) for a, b in zip(probe.chunks, probe.chunks[1:])]
        row = {"i": i, "frames": res.stats["frames"], "tokens": res.stats["prompt_tokens"], "wall_ms": 1000 * (t1 - t0),
               "host_ms": {k: 1000 * (v - t0) for k, v in h.items()}, "gpu_ms": gpu,
               "chunks": len(probe.chunks), "chunk_gap_max_ms": max(gaps, default=0.0),
               "usage": {k: u1[k] - u0[k] for k in u0}, "gc_ms": pauses.during(t0, t1).get("ms", 0.0)}
        rows.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                          if k not in ("host_ms", "gpu_ms")}), flush=True)

    if probe.prof is not None:
        import pstats

        probe.prof.dump_stats(args.cprofile)
        for key in ("tottime", "cumulative"):
            pstats.Stats(probe.prof).sort_stats(key).print_stats(40)
        probe.prof = None
    steady, walls = _steady(lambda n: timed(node_line, STEADY_TEXT, "English", n, 0))
    for r in rows:
        r["overhead_ms"] = r["wall_ms"] - r["frames"] * steady
        h, g = (collections.defaultdict(lambda: float("nan"), d) for d in (r["host_ms"], r["gpu_ms"]))
        r["split_ms"] = {  # host spans, then the GPU's
            "prep": h["rows"],
            "open_host": h["admit_start"] - h["rows"], "admit_host": h["admitted"] - h["admit_start"],
            "prefill_gpu": g["admitted"],
            "frames_gpu_over_steady": g["finish"] - g["admitted"] - r["frames"] * steady,
            "host_after_finish": h["audio_host"] - h["finish"],
            "gpu_audio_after_last_frame": g["audio_queued"] - g["finish"],
            "results": h["returned"] - h["audio_host"], "make_audio": r["wall_ms"] - h["returned"]}
    over = sorted(rows, key=lambda r: -r["overhead_ms"])
    print(f"steady {steady:.3f} ms/frame; overhead p50 {percentile([r['overhead_ms'] for r in rows], 50):.1f} "
          f"p95 {percentile([r['overhead_ms'] for r in rows], 95):.1f} ms; load {load_s:.2f} s")
    print("the ten worst (i frames overhead | " + " ".join(over[0]["split_ms"]) + " | cpu minflt nvcsw nivcsw gc)")
    for r in over[:10]:
        u = r["usage"]
        print(f"{r['i']:2d} {r['frames']:4d} {r['overhead_ms']:6.1f} | "
              + " ".join(f"{v:6.2f}" for v in r["split_ms"].values())
              + f" | {u['cpu_ms']:6.1f} {u['minflt']:5d} {u['nvcsw']:4d} {u['nivcsw']:3d} {r['gc_ms']:.1f}")
    cols = list(rows[0]["split_ms"])
    print("p50 of each span: " + " ".join(f"{c} {percentile([r['split_ms'][c] for r in rows], 50):.2f}" for c in cols))
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "takes": args.takes,
                                              "variant": args.variant, "load_s": load_s, "steady_ms": steady,
                                              "steady_walls_s": walls, "notes": eng.info.notes, "rows": rows},
                                             indent=1))


def timed(fn, *a) -> float:
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
