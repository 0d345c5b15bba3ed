"""What a load does, thread by thread, for bench/load_ab.py's workers: host-clock spans of its steps, a sampler
of every thread's Python stack, and the diagnosis switches (environment variables, set per tree variant with
load_ab's --env):

    LOAD_AB_CODEC_SERIAL=1   the codec's captures run on the load's main thread, after the talker's
    LOAD_AB_SAMPLE=1         sample every thread's stack during the load (StackSampler)
    LOAD_AB_CPROFILE=1       cProfile the load's main thread
    LOAD_AB_SWITCH_S=S       the interpreter's thread switch interval during the load
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

SERIAL_ENV = "LOAD_AB_CODEC_SERIAL"
SAMPLE_ENV = "LOAD_AB_SAMPLE"
CPROFILE_ENV = "LOAD_AB_CPROFILE"
SWITCH_ENV = "LOAD_AB_SWITCH_S"
CODEC_THREAD = "codec-precapture"  # the name engine/gpu/codec_graph.py gives its capture threads
WAIT = "wait for the codec threads"


def apply_switches():
    """Set up what the environment asks for, before the load: (StackSampler or None, cProfile.Profile or None)."""
    if os.environ.get(SERIAL_ENV):
        from engine.gpu.codec_graph import CodecGraphs

        CodecGraphs.precapture_beside = lambda self, buckets: setattr(self, "warm_buckets", tuple(buckets))
    if os.environ.get(SWITCH_ENV):
        sys.setswitchinterval(float(os.environ[SWITCH_ENV]))
    profile = None
    if os.environ.get(CPROFILE_ENV):  # deterministic: it slows the profiled thread
        import cProfile

        profile = cProfile.Profile()
    return (StackSampler() if os.environ.get(SAMPLE_ENV) else None), profile


def profile_tables(profile, top: int = 35) -> dict:
    """The profile's functions by own time and by cumulative time, as pstats prints them."""
    import io
    import pstats

    tables = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(profile, stream=buf).sort_stats(key).print_stats(top)
        tables[f"profile_{key}"] = buf.getvalue()
    return tables


class StackSampler:
    """Every few ms during the load, where each thread's Python stack is: its innermost frame, and the innermost
    frame in the engine. A thread that runs C++ with the GIL released (a cuDNN plan, a kernel load) shows the
    call that entered it; so does one waiting for the GIL. Counts, most first, per thread."""

    def __init__(self, interval_s: float = 0.002):
        import collections
        import threading

        self.interval_s = interval_s
        self.counts = collections.Counter()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="stack-sampler", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        import threading

        me = threading.get_ident()
        while not self.stop_event.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                leaf = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}:{frame.f_lineno}"
                mine, f = "-", frame
                while f is not None:
                    name = f.f_code.co_filename
                    if "/engine/" in name:
                        mine = f"{name.split('/engine/')[-1]}:{f.f_code.co_name}:{f.f_lineno}"
                        break
                    f = f.f_back
                self.counts[(names.get(ident, "?"), mine, leaf)] += 1
            time.sleep(self.interval_s)

    def stop(self, top: int = 60) -> list:
        self.stop_event.set()
        self.thread.join()
        return [{"thread": k[0], "engine": k[1], "leaf": k[2], "samples": n} for k, n in self.counts.most_common(top)]


def wrap_calls(owner, name: str, record, sync=None) -> None:
    """Replace owner.name by a wrapper that calls record(args, start, end) after each call (host clock,
    perf_counter s). sync, if given, runs before the start is stamped and before the end is (a profile that
    times GPU work); without it nothing waits, so steps on other threads are left to run."""
    real = getattr(owner, name)

    def wrapper(*a, **k):
        if sync:
            sync()
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            if sync:
                sync()
            record(a, t, time.perf_counter())

    setattr(owner, name, wrapper)


def record_spans() -> list:
    """The load's steps as host-clock spans, each with its thread, and no sync of its own (a sync would stall
    the threads that capture beside the main one): the weights, each capture (frame, prefill or codec piece),
    the codec states' first frames, the waits for the codec threads and the warm-up requests. The worker makes
    the times relative to the load's start. For the critical path of a load whose steps run side by side. A
    step an older tree does not have is left out."""
    import threading

    import engine.engine as engine_mod
    from engine.checkpoint import loader
    from engine.gpu import codec_graph, frame_graph, prefill_graph

    spans = []

    def span(owner, name, label):
        if not hasattr(owner, name):
            return

        def record(a, start, end):
            spans.append({"what": label(a) if callable(label) else label, "thread": threading.current_thread().name,
                          "start_s": start, "end_s": end})

        wrap_calls(owner, name, record)

    span(loader, "load_components", "weights")
    span(engine_mod.Engine, "_warmup", "warm-up (all)")
    for name in ("generate", "generate_batch"):  # the streamed warm-ups are generators: in "warm-up (all)"
        span(engine_mod.Engine, name, f"warm-up {name}")
    span(frame_graph, "capture", "frame graph capture")
    span(prefill_graph, "capture", "prefill graph capture")
    span(codec_graph.CodecGraphs, "capture", lambda a: f"codec piece {a[2]} x {a[1]} rows")
    span(codec_graph.CodecGraphs, "state", lambda a: f"codec state {a[1]} rows")
    span(codec_graph.CodecGraphs, "settle", WAIT)
    return spans


def codec_times(spans: list, load_s: float) -> dict:
    """From a load's spans (times from its start): codec_thread_s, from the first codec capture thread's start
    to the last one's end, and thread_wait_s, how long the load waited for them. Empty where no codec thread
    ran (the codec captured on the main thread, or a tree before the thread)."""
    during = [sp for sp in spans if sp["start_s"] <= load_s]
    codec = [sp for sp in during if sp["thread"] == CODEC_THREAD]
    if not codec:
        return {}
    return {"codec_thread_s": max(sp["end_s"] for sp in codec) - min(sp["start_s"] for sp in codec),
            "thread_wait_s": sum(sp["end_s"] - sp["start_s"] for sp in during
                                 if sp["what"] == WAIT and sp["thread"] != CODEC_THREAD)}


def span_summary(spans: list, load_s: float) -> str:
    """Per thread, the load's spans by kind (codec pieces by row count): count, seconds in all, first start and
    last end (s from the load's start)."""
    groups = {}
    for sp in spans:
        if sp["start_s"] > load_s:  # the requests after the load
            continue
        kind = "codec pieces, " + sp["what"].split(" x ")[-1] if sp["what"].startswith("codec piece") else sp["what"]
        g = groups.setdefault((sp["thread"], kind), [0, 0.0, sp["start_s"], sp["end_s"]])
        g[0] += 1
        g[1] += sp["end_s"] - sp["start_s"]
        g[2], g[3] = min(g[2], sp["start_s"]), max(g[3], sp["end_s"])
    return "\n".join(f"      {thread:17s} {kind:34s} {n:3d}x {total:5.2f} s  {first:5.2f} -> {last:5.2f}"
                     for (thread, kind), (n, total, first, last) in sorted(groups.items(), key=lambda kv: kv[1][2]))
