"""Where a scheduler's time goes: the engine's `Scheduler` in-process (as the server runs it, without HTTP), under
`--streams` closed-loop callers of the real-length mix and under Poisson arrivals at each of `--rates`, its loop's
phases timed and each arrival's first audio taken apart.

    python bench/serve_profile.py --configs 0.6b:custom_voice --device cuda --rows 64 --streams 64 --rates 20 --out DIR
    python bench/serve_profile.py --model TINY_DIR --device cpu --rows 4 --streams 4 --seconds 2 --out DIR   # CI

The loop's phases: `frames` (one step of every row held: the talker and its code predictor), `admit` (a
joining request's prefill) and `codec` (a chunk's codec pass and its hand-over to the callers). Per config,
two windows of `--seconds` under the same load:
  * free: audio s/s, loop steps/s, and each phase's host ms a second (on a GPU its launches, not its work);
  * synced: the device is synchronised after each phase, so a phase's ms a second is its host and device time
    together, and the phases add up to the loop's time (the overlap the loop has otherwise is lost, so its
    audio s/s is lower). The rest of the wall time is the scheduler's own work and its waits.
Under arrivals at a rate, the loop's phases are timed freely, and each request's first audio is split into
`prepare` (submit's own work: text and prompt), `wait` (queued until the loop's next boundary took its rows) and
`join` (from then to its first chunk: its prefill, the first chunk's frames, the codec pass, the hand-over).
A Base checkpoint's requests are ICL clones of the serving benches' saved voice (serve_voice.py).
`--configs SIZE:TYPE` writes real-size random checkpoints (EOS disabled, in $BENCH_CKPT_DIR), so every request
decodes exactly its sentence's natural length.

Writes DIR/serve_profile_<name>.json and prints the table.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real_length_script import script  # noqa: E402
from timing import percentile, write_json  # noqa: E402

PHASES = ("frames", "admit", "codec")
WORKERS = 32  # threads that submit and read the arrivals (more than ever run at once at the rates measured)
SPEAKER = "ryan"


class Phases:
    """Seconds and calls of each phase while `on`; with `sync` each phase first waits for its device work."""

    def __init__(self):
        self.on = self.sync = False
        self.lock = threading.Lock()
        self.windows = 0  # windows begun (reset() starts one)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.seconds = {p: 0.0 for p in PHASES}
            self.calls = {p: 0 for p in PHASES}
            self.windows += 1

    def marked(self, name: str, fn, device):
        import torch

        def call(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            window, t0 = self.windows, time.perf_counter()
            out = fn(*args, **kwargs)
            if self.sync and device.type == "cuda":
                torch.cuda.synchronize(device)
            with self.lock:
                if window == self.windows:  # a call begun in the window before counts in neither
                    self.seconds[name] += time.perf_counter() - t0
                    self.calls[name] += 1
            return out
        return call

    def table(self, wall: float) -> dict:
        with self.lock:
            return {p: {"calls": self.calls[p], "ms_per_s": 1000 * self.seconds[p] / wall} for p in PHASES}

    @contextlib.contextmanager
    def window(self, sync: bool):
        """Time the phases over the block; afterwards the dict it yields holds `wall` (s), `phases` (table) and
        `steps_per_s` (frames' calls a second)."""
        self.sync = sync
        self.reset()
        self.on = True
        out, t0 = {}, time.perf_counter()
        try:
            yield out
        finally:
            self.on = False
            out["wall"] = time.perf_counter() - t0
            out["phases"] = self.table(out["wall"])
            out["steps_per_s"] = out["phases"]["frames"]["calls"] / out["wall"]


PHASE_TIMES = Phases()


def mark_phases(engine) -> None:
    """Time the loop's three phases (this process only)."""
    from engine import codec_session

    runner, dev = engine.runner, engine.device
    runner.next_frame = PHASE_TIMES.marked("frames", runner.next_frame, dev)
    runner.admit = PHASE_TIMES.marked("admit", runner.admit, dev)
    for name in ("push", "admit"):  # the codec's work in the loop: each chunk's decode, each admitted row's start
        fn = getattr(codec_session.CodecSession, name)
        if not getattr(fn, "marked", False):  # once a process, over several configs
            fn = PHASE_TIMES.marked("codec", fn, dev)
            fn.marked = True
            setattr(codec_session.CodecSession, name, fn)


def sentences(voice=None) -> list:
    """The real-length mix as (request, natural frames): preset-speaker requests, or with `voice` (a Base
    checkpoint) ICL clones of it."""
    from engine import Request

    who = {"mode": "custom", "speaker": SPEAKER} if voice is None else {"mode": "clone", "voice": voice}
    return [(Request(text=text, language=lang, **who), frames) for lang, text, frames in script()]


def submit(scheduler, engine, mix: list, n: int, first: int):
    """The mix's n-th sentence (seed n) to the scheduler, for its natural length, as the benches' requests ask,
    its first chunk `first` frames."""
    req, frames = mix[n % len(mix)]
    return scheduler.submit(req, seed=n, params=engine.defaults.capped(frames), first_chunk_frames=first)


class Load:
    """`streams` callers, each submitting the next sentence of the mix when its last one ends."""

    def __init__(self, scheduler, engine, mix: list, streams: int, first: int):
        self.s, self.engine, self.first, self.mix = scheduler, engine, first, mix
        self.lock, self.audio_s, self.stop, self.errors = threading.Lock(), 0.0, False, []
        self.threads = [threading.Thread(target=self._caller, args=(i,), daemon=True) for i in range(streams)]
        for t in self.threads:
            t.start()

    def _caller(self, i: int) -> None:
        n = i
        rate = self.engine.sample_rate
        while not self.stop:
            try:
                ticket = submit(self.s, self.engine, self.mix, n, self.first)
                for chunk in ticket:
                    with self.lock:
                        self.audio_s += chunk.audio.numel() / rate
                    if self.stop:
                        ticket.cancel()
                        break
            except Exception as exc:  # noqa: BLE001 - counted and shown; a failed request ends the run
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            n += len(self.threads)

    def received(self) -> float:
        with self.lock:
            return self.audio_s

    def close(self) -> None:
        self.stop = True
        for t in self.threads:
            t.join(60)


class Arrivals:
    """Poisson arrivals at `rate` a second for `seconds` (each request submitted and read to its end by a worker
    thread), every request's first audio timed in parts; run() returns when the last one has ended."""

    PARTS = ("prepare", "wait", "join", "first")

    def __init__(self, scheduler, engine, mix: list, rate: float, seconds: float, first: int, seed: int = 0):
        import random

        self.s, self.engine, self.mix, self.first = scheduler, engine, mix, first
        self.rate, self.seconds, self.rng = rate, seconds, random.Random(seed)
        self.lock, self.records, self.errors = threading.Lock(), [], []

    def run(self) -> None:
        # A pool, as the server's executor: every new thread that builds a prompt on a GPU takes a cuBLAS handle.
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            n, at = 0, self.rng.expovariate(self.rate)
            start = time.perf_counter()
            while at < self.seconds:
                time.sleep(max(0.0, start + at - time.perf_counter()))
                pool.submit(self._one, n)
                n, at = n + 1, at + self.rng.expovariate(self.rate)

    def _one(self, n: int) -> None:
        try:
            ticket = submit(self.s, self.engine, self.mix, n, self.first)
            prepared = time.perf_counter() - ticket._t0
            first = next(iter(ticket)).elapsed_s
            for _ in ticket:
                pass
        except Exception as exc:  # noqa: BLE001 - counted and shown; a failed request ends the run
            with self.lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        ms = {"prepare": prepared, "wait": ticket.admitted_s - prepared, "join": first - ticket.admitted_s,
              "first": first}
        with self.lock:
            self.records.append({k: 1000 * v for k, v in ms.items()})

    def summary(self) -> dict:
        out = {"requests": len(self.records)}
        for part in self.PARTS:
            xs = [r[part] for r in self.records]
            out[part] = {"p50_ms": percentile(xs, 50), "p95_ms": percentile(xs, 95)}
        return out


def run_config(model: Path, label: str, args) -> dict:
    from engine import Engine, Scheduler

    load = {"device": args.device, "dtype": args.dtype, "cuda_graphs": args.cuda_graphs, "triton": args.triton}
    voice = bench_voice(model, load)
    engine = Engine.load(model, max_takes=args.rows, warm_takes=args.rows, **load)
    mark_phases(engine)
    mix = sentences(voice)
    out = {"label": label, "model": str(model), "mode": mix[0][0].mode, "engine": engine.info.summary(),
           "rows": args.rows, "streams": args.streams, "boundary_frames": args.boundary_frames,
           "first_chunk_frames": args.first_chunk_frames}
    with Scheduler(engine, max_rows=args.rows, max_queue=max(64, 2 * args.streams),
                   chunk_frames=args.boundary_frames) as s:
        out["rates"] = [arrivals(s, engine, mix, rate, label, args) for rate in args.rates]
        if args.streams > 0:
            saturate(s, engine, mix, label, args, out)
    engine.release()
    return out


def bench_voice(model: Path, load: dict):
    """A Base checkpoint's requests clone the serving benches' saved voice (serve_voice.py); None otherwise."""
    from serve_voice import is_base, saved_voice

    from engine.voice import Voice

    return Voice.load(saved_voice(model, load)) if is_base(model) else None


def arrivals(s, engine, mix: list, rate: float, label: str, args) -> dict:
    """One window of Poisson arrivals (the first requests, which find the loop idle, are left out: a warm-up)."""
    Arrivals(s, engine, mix, rate, max(1.0, 4 / rate), args.first_chunk_frames).run()
    a = Arrivals(s, engine, mix, rate, args.seconds, args.first_chunk_frames, seed=1)
    with PHASE_TIMES.window(sync=False) as w:
        a.run()
    if a.errors:
        raise SystemExit(f"{label}: {len(a.errors)} requests failed, e.g. {a.errors[0]}")
    return {"rate": rate, **a.summary(), "steps_per_s": w["steps_per_s"], "phases": w["phases"]}


def saturate(s, engine, mix: list, label: str, args, out: dict) -> None:
    """The free and synced windows under `args.streams` closed-loop callers."""
    load_ = Load(s, engine, mix, args.streams, args.first_chunk_frames)
    try:
        time.sleep(args.warm_s)  # every caller has joined once; the rows are full
        for window in ("free", "synced"):
            a0 = load_.received()
            with PHASE_TIMES.window(sync=window == "synced") as w:
                time.sleep(args.seconds)
            out[window] = {"audio_s_per_s": (load_.received() - a0) / w["wall"], "steps_per_s": w["steps_per_s"],
                           "phases": w["phases"]}
    finally:
        load_.close()
    if load_.errors:
        raise SystemExit(f"{label}: {len(load_.errors)} requests failed, e.g. {load_.errors[0]}")


def report(results: list) -> str:
    return "\n\n".join(t for t in (rates_table(results), saturation_table(results)) if t)


def rates_table(results: list) -> str:
    rows = [(r, a) for r in results for a in r.get("rates", [])]
    if not rows:
        return ""
    lines = ["| model | rows | req/s | requests | " + " | ".join(f"{p} p50 / p95 ms" for p in Arrivals.PARTS)
             + " | loop steps/s | " + " | ".join(f"{p} ms a s" for p in PHASES) + " |",
             "|---|---|---|---|" + "---|" * (len(Arrivals.PARTS) + 1 + len(PHASES))]
    for r, a in rows:
        parts = [f"{a[p]['p50_ms']:.1f} / {a[p]['p95_ms']:.1f}" for p in Arrivals.PARTS]
        ms = [f"{a['phases'][p]['ms_per_s']:.0f}" for p in PHASES]
        lines.append(f"| {r['label']} | {r['rows']} | {a['rate']:g} | {a['requests']} | " + " | ".join(parts)
                     + f" | {a['steps_per_s']:.1f} | " + " | ".join(ms) + " |")
    return "\n".join(lines)


def saturation_table(results: list) -> str:
    results = [r for r in results if "free" in r]
    if not results:
        return ""
    lines = ["| model | rows | streams | window | audio s/s | loop steps/s | "
             + " | ".join(f"{p} ms a s" for p in PHASES) + " | rest ms a s |",
             "|---|---|---|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for r in results:
        for window in ("free", "synced"):
            w = r[window]
            ms = [w["phases"][p]["ms_per_s"] for p in PHASES]
            lines.append(f"| {r['label']} | {r['rows']} | {r['streams']} | {window} | {w['audio_s_per_s']:.1f} | "
                         f"{w['steps_per_s']:.1f} | " + " | ".join(f"{x:.0f}" for x in ms)
                         + f" | {max(0.0, 1000 - sum(ms)):.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append", default=[],
                    help="a CustomVoice or Base checkpoint folder (Base: ICL clones of the benches' saved voice)")
    ap.add_argument("--configs", nargs="+", default=[], help="SIZE:TYPE random checkpoints, e.g. 0.6b:base")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--streams", type=int, default=64, help="closed-loop callers (0: no saturated windows)")
    ap.add_argument("--rates", type=float, nargs="*", default=[], help="Poisson arrivals a second, a window each")
    ap.add_argument("--boundary-frames", type=int, default=2, help="the scheduler's chunk_frames, as the server's")
    ap.add_argument("--first-chunk-frames", type=int, default=1, help="frames of a request's first chunk, as the "
                                                                      "server's")
    ap.add_argument("--warm-s", type=float, default=3.0, help="s of load before measuring")
    ap.add_argument("--seconds", type=float, default=5.0, help="s of each measured window (of arrivals, for a rate)")
    for opt in ("device", "dtype", "cuda-graphs", "triton"):
        ap.add_argument(f"--{opt}", default="auto")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="")
    args = ap.parse_args(argv)
    runs = [(m, m.name) for m in args.model]
    if args.configs:
        from gpu_bench import checkpoint

        runs += [(checkpoint(*c.partition(":")[::2]), c) for c in args.configs]
    if not runs:
        ap.error("give --model DIR or --configs SIZE:TYPE")
    results = []
    for model, label in runs:
        results.append(run_config(model, label, args))
        if "free" in results[-1]:
            print(f"{label}: {results[-1]['free']['audio_s_per_s']:.1f} s of audio a second", flush=True)
    text = report(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name or ("cpu" if args.device == "cpu" else "gpu")
    write_json(args.out / f"serve_profile_{name}.json", {"configs": results, "table": text})
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
