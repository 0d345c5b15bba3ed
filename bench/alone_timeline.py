"""Where a lone request's first audio goes: `Engine.stream` against the engine's `Scheduler` (as the server runs it,
without HTTP), in one process, each request alone, on a host timeline.

    python bench/alone_timeline.py --model DIR [--voice FILE] --device cuda --requests 12 --out DIR --name NAME

The engine loads as the server loads (64 rows, all of them warm). Each request runs alone, first through
`Engine.stream`, then through a `Scheduler` of 64 rows joining every 2 frames; both with a one-frame first chunk,
and the first pass over the requests warms both paths. For each request the host time of each step before its first
audio is taken (when it began, ms from the request's start, and how long it took): `prepare` (the checks and the
prompt), `session` (the codec session's opening), `open` (the decode loop's start), `admit` (the prefill's launch),
`start` (the codec's start of the admitted row's state, slotted sessions only), `next_frame` (each frame's launch),
`push` (the codec's hand-over of the first chunk, waiting for its audio) and, for the scheduler, `put` (the chunk
handed to the request's ticket) and the time the chunk takes to reach the caller's thread. No device synchronisation
is added: on a GPU a step's host time holds its waits for the GPU only where the step itself waits. With `--voice`
(a Base checkpoint's saved voice) the requests are ICL clones of it.

Writes DIR/alone_timeline_<name>.json.gz (the medians and each request's timeline) and prints the medians' table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve_profile import sentences  # noqa: E402
from timing import write_json  # noqa: E402

STEPS = ("prepare", "session", "open", "admit", "start", "next_frame", "push", "put")
ROWS, BOUNDARY_FRAMES = 64, 2  # the server's defaults


class Marks:
    """(step, start, end) of every marked call since clear()."""

    def __init__(self):
        self.calls = []

    def wrap(self, name: str, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.calls.append((name, t0, time.perf_counter()))
            return out
        return call

    def timeline(self, t0: float, first: float) -> dict:
        """{step: {at_ms, ms, n}} of the calls that began before the first audio (their time up to it)."""
        out = {}
        for name, a, b in self.calls:
            if a > t0 + first:
                continue
            step = out.setdefault(name, {"at_ms": 1000 * (a - t0), "ms": 0.0, "n": 0})
            step["ms"] += 1000 * (min(b, t0 + first) - a)
            step["n"] += 1
        return out


def mark_steps(engine, marks: Marks) -> None:
    from engine import codec_session, ticket

    for name in ("open", "admit", "next_frame"):
        setattr(engine.runner, name, marks.wrap(name, getattr(engine.runner, name)))
    engine.prepare = marks.wrap("prepare", engine.prepare)
    codec_session.CodecSession.__init__ = marks.wrap("session", codec_session.CodecSession.__init__)
    codec_session.CodecSession.admit = marks.wrap("start", codec_session.CodecSession.admit)
    codec_session.CodecSession.push = marks.wrap("push", codec_session.CodecSession.push)
    ticket.Ticket._put = marks.wrap("put", ticket.Ticket._put)


def through_stream(engine, marks: Marks, req, frames: int, seed: int) -> dict:
    marks.calls.clear()
    t0, first = time.perf_counter(), None
    for chunk in engine.stream(req, seed=seed, params=engine.defaults.capped(frames), chunk_frames=8,
                               first_chunk_frames=1):
        if first is None and chunk.audio.numel():
            first = time.perf_counter() - t0
    return {"first_ms": 1000 * first, "steps": marks.timeline(t0, first)}


def through_scheduler(scheduler, engine, marks: Marks, req, frames: int, seed: int) -> dict:
    time.sleep(0.05)  # the loop of the request before has ended: this one starts a loop, as a lone request does
    marks.calls.clear()
    t0 = time.perf_counter()
    ticket = scheduler.submit(req, seed=seed, params=engine.defaults.capped(frames), first_chunk_frames=1)
    chunks = iter(ticket)
    chunk = next(chunks)
    first = time.perf_counter() - t0
    for _ in chunks:
        pass
    return {"first_ms": 1000 * first, "admitted_ms": 1000 * ticket.admitted_s, "put_ms": 1000 * chunk.elapsed_s,
            "to_caller_ms": 1000 * (first - chunk.elapsed_s), "steps": marks.timeline(t0, first)}


def medians(records: list) -> dict:
    out = {k: statistics.median(r[k] for r in records) for k in records[0] if k != "steps"}
    for step in STEPS:
        if any(step in r["steps"] for r in records):
            out[step] = {f: statistics.median(r["steps"].get(step, {}).get(f, 0.0) for r in records)
                         for f in ("at_ms", "ms", "n")}
    return out


def table(summary: dict) -> str:
    lines = ["| path | first audio p50 ms | " + " | ".join(f"{s} at / ms" for s in STEPS) + " | to the caller ms |",
             "|---|---|" + "---|" * (len(STEPS) + 1)]
    for path in ("stream", "scheduler"):
        m = summary[path]
        steps = [f"{m[s]['at_ms']:.2f} / {m[s]['ms']:.2f}" if s in m else "-" for s in STEPS]
        to_caller = f"{m['to_caller_ms']:.2f}" if "to_caller_ms" in m else "-"
        lines.append(f"| {path} | {m['first_ms']:.2f} | " + " | ".join(steps) + f" | {to_caller} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--voice", type=Path, help="a saved voice (Base): ICL clones of it")
    ap.add_argument("--requests", type=int, default=12)
    for opt in ("device", "dtype", "cuda-graphs", "triton"):
        ap.add_argument(f"--{opt}", default="auto")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="gpu")
    args = ap.parse_args(argv)
    from engine import Engine, Scheduler
    from engine.voice import Voice

    engine = Engine.load(args.model, max_takes=ROWS, warm_takes=ROWS, device=args.device, dtype=args.dtype,
                         cuda_graphs=args.cuda_graphs, triton=args.triton)
    marks = Marks()
    mark_steps(engine, marks)
    mix = sentences(Voice.load(args.voice) if args.voice else None)
    runs = [mix[i % len(mix)] for i in range(args.requests)]
    out = {"stream": [], "scheduler": []}
    for kept in (False, True):  # the first pass warms the path
        got = [through_stream(engine, marks, req, frames, seed) for seed, (req, frames) in enumerate(runs)]
        out["stream"] += got if kept else []
    with Scheduler(engine, max_rows=ROWS, chunk_frames=BOUNDARY_FRAMES) as s:
        for kept in (False, True):
            got = [through_scheduler(s, engine, marks, req, frames, seed) for seed, (req, frames) in enumerate(runs)]
            out["scheduler"] += got if kept else []
    summary = {path: medians(records) for path, records in out.items()}
    text = table(summary)
    print(f"{engine.info.summary()}\n\n{text}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"alone_timeline_{args.name}.json.gz",
               {"engine": engine.info.summary(), "requests": args.requests, "summary": summary, "records": out,
                "table": text})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
