"""Where a one-take request's overhead goes, request by request, on the GPU clock and the host clock.

    python bench/request_timeline.py [--size 0.6b] [--out FILE.json]

Loads a real-size random CustomVoice checkpoint with the node's defaults, runs the real-length script
(bench/real_length_script.py) once at one take in a fresh process, and times each request by wrapping the
engine's own steps (no engine change):
  * GPU (CUDA events): the request's first launch, the prefill end, the last frame's end, each codec piece
    on the side stream, and the audio ready on the main stream;
  * host: the chunk syncs, the end of the decode loop, the copy of the audio to the host, the return;
  * Python's garbage collector: time spent in collections during the request.
It then replays one frame graph warm to get the pure graph ms per frame, so that
    wall = prefill + frames x graph ms + bubbles between frames + tail after the last frame + the rest.
Prints a line per request and the columns' p50/p95; writes everything to --out.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_bench import checkpoint
from real_length_script import script

SPEAKER = "ryan"


class Probe:
    """Collects host times and CUDA events of the request being run."""

    def __init__(self):
        self.gc_ms = 0.0
        self._gc_t = None
        gc.callbacks.append(self._gc)
        self.reset()

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_t = time.perf_counter()
        elif self._gc_t is not None:
            self.gc_ms += 1000 * (time.perf_counter() - self._gc_t)
            self._gc_t = None

    def reset(self):
        self.host = {}
        self.events = {}
        self.pieces = []  # (frames, final, start event, end event)
        self.chunks = []  # host seconds of each chunk's arrival
        self.gc_ms = 0.0

    def event(self, name, stream=None):
        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        self.events[name] = e

    def mark(self, name):
        self.host[name] = time.perf_counter()


def install(probe: Probe):
    import engine.engine as E
    from engine.gpu import codec_graph, codec_overlap

    tap, collect, trim = E._tap, E.collect, E.Engine._trim

    def _tap(chunks, push):
        for chunk in tap(chunks, push):
            probe.chunks.append(time.perf_counter())
            yield chunk

    def _collect(chunks):
        out = collect(chunks)
        probe.mark("collected")
        return out

    def _trim(wav, lengths):
        probe.mark("trim_start")
        out = trim(wav, lengths)
        probe.mark("trim_end")
        return out

    decode = codec_graph.CodecGraphs.decode

    def _decode(self, codes, state, final=False):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = decode(self, codes, state, final=final)
        b.record()
        probe.pieces.append((codes.shape[-1], final, a, b))
        return out

    finish = codec_overlap.OverlappedDecode.finish

    def _finish(self):
        probe.event("last_frame")  # the main stream: every frame enqueued before this
        probe.mark("finish")
        out = finish(self)
        probe.event("audio_ready")
        return out

    E._tap, E.collect, E.Engine._trim = _tap, _collect, staticmethod(_trim)
    codec_graph.CodecGraphs.decode = _decode
    codec_overlap.OverlappedDecode.finish = _finish


def graph_ms_by_window(eng, frames=100) -> dict:
    """Warm back-to-back replays of each one-row frame graph: the pure GPU ms per frame of each window."""
    out = {}
    for (batch, window), graph in sorted(eng.runner.graphs.items()):
        if batch != 1:
            continue
        graph.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(frames):
            graph.replay()
        b.record()
        b.synchronize()
        out[window] = a.elapsed_time(b) / frames
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def run_script(eng, probe, chunk: int) -> list:
    from engine import Request

    rows = []
    for i, (lang, text, frames) in enumerate(script()):
        params = eng.defaults.replace(max_new_tokens=frames, min_new_tokens=min(eng.defaults.min_new_tokens, frames))
        req = Request(mode="custom", text=text, language=lang, speaker=SPEAKER)
        probe.reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        probe.event("start")
        res = eng.generate(req, takes=1, seed=i, params=params, progress_every=chunk)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        ev, h = probe.events, probe.host
        gpu = {k: ev["start"].elapsed_time(e) for k, e in ev.items()}
        pieces = [(f, fin, ev["start"].elapsed_time(a), a.elapsed_time(b)) for f, fin, a, b in probe.pieces]
        last_frame = gpu["last_frame"]
        row = {
            "i": i, "frames": frames, "tokens": res.stats["prompt_tokens"], "wall_ms": 1000 * (t1 - t0),
            "prefill_ms": 1000 * res.stats["prefill_s"],
            "gpu_last_frame_ms": last_frame, "gpu_audio_ready_ms": gpu["audio_ready"],
            "host_collected_ms": 1000 * (h["collected"] - t0), "host_finish_ms": 1000 * (h["finish"] - t0),
            "host_trim_ms": 1000 * (h["trim_end"] - h["trim_start"]),
            "host_after_trim_ms": 1000 * (t1 - h["trim_end"]),
            "chunk_gaps_ms": [1000 * (b - a) for a, b in zip(probe.chunks, probe.chunks[1:])],
            "pieces": pieces, "gc_ms": probe.gc_ms,
        }
        # the side pieces still running after the last frame, and the final piece
        row["side_after_last_frame_ms"] = max([s + d for _, fin, s, d in pieces if not fin] + [last_frame]) - last_frame
        row["final_piece_ms"] = sum(d for _, fin, _, d in pieces if fin)
        row["tail_ms"] = row["wall_ms"] - last_frame
        rows.append(row)
        print(f"{frames:4d} f {row['tokens']:4d} tok  wall {row['wall_ms']:7.1f}  prefill {row['prefill_ms']:4.1f}  "
              f"last frame {last_frame:7.1f}  audio ready {gpu['audio_ready']:7.1f}  tail {row['tail_ms']:5.1f} "
              f"(side lag {row['side_after_last_frame_ms']:4.1f}, final piece {row['final_piece_ms']:4.1f}, "
              f"trim {row['host_trim_ms']:4.1f})  gc {probe.gc_ms:4.1f}  pieces "
              + " ".join(f"{f}{'F' if fin else ''}@{s:.0f}+{d:.1f}" for f, fin, s, d in pieces), flush=True)
    return rows


COLS = ["wall_ms", "overhead_vs_graph_ms", "prefill_ms", "bubble_ms", "bubble_per_frame_ms", "tail_ms",
        "side_after_last_frame_ms", "final_piece_ms", "host_trim_ms", "gc_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--out", default=None)
    ap.add_argument("--chunks", type=int, nargs="+", default=[4],
                    help="progress_every values (frames per host sync); the script runs once per value, "
                         "the first in order (every length new), the others on lengths already seen")
    args = ap.parse_args()

    from engine import Engine

    ckpt = checkpoint(args.size)
    t = time.perf_counter()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t
    probe = Probe()
    install(probe)
    runs = {chunk: run_script(eng, probe, chunk) for chunk in args.chunks}

    by_window = graph_ms_by_window(eng)
    print("graph ms/frame by window: " + ", ".join(f"{w}: {ms:.3f}" for w, ms in by_window.items()))
    out = {"gpu": torch.cuda.get_device_name(), "size": args.size, "load_s": load_s,
           "graph_ms_by_window": by_window, "notes": eng.info.notes, "runs": {}}
    for chunk, rows in runs.items():
        for r in rows:  # the GPU time the frames need back to back, each at its own window
            pure = sum(by_window[eng.runner._window(r["tokens"] + j)] for j in range(r["frames"]))
            r["bubble_ms"] = r["gpu_last_frame_ms"] - r["prefill_ms"] - pure
            r["bubble_per_frame_ms"] = r["bubble_ms"] / r["frames"]
            r["overhead_vs_graph_ms"] = r["wall_ms"] - pure
        summary = {c: {"p50": pct([r[c] for r in rows], 50), "p95": pct([r[c] for r in rows], 95),
                       "max": max(r[c] for r in rows)} for c in COLS}
        print(f"--- progress_every {chunk}")
        for c in COLS:
            s = summary[c]
            print(f"{c:28s} p50 {s['p50']:7.2f}  p95 {s['p95']:7.2f}  max {s['max']:7.2f}")
        out["runs"][str(chunk)] = {"rows": rows, "summary": summary}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
