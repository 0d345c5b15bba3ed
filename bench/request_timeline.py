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

from engine_probe import NO_FLUSH, script_params
from gpu_bench import CKPT_ROOT, checkpoint
from real_length_script import script
from timing import cuda_kernels, mean_gpu_ms, percentile

SPEAKER = "ryan"


class Probe:
    """Collects host times and CUDA events of the request being run."""

    def __init__(self):
        self.variant = "engine"
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

    def event(self, name):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.events[name] = e

    def mark(self, name):
        self.host[name] = time.perf_counter()


def install(probe: Probe):
    import engine.engine as E
    from engine.gpu import codec_graph, codec_overlap

    tap, collect, trim = codec_overlap.OverlappedDecode.tap, E.collect, E.Engine._trim

    def _tap(self, chunks):
        for chunk in tap(self, chunks):
            probe.chunks.append(time.perf_counter())
            yield chunk

    def _collect(chunks):
        out = collect(chunks)
        probe.mark("collected")
        return out

    def _trim(wav, lengths):
        probe.mark("trim_start")
        if probe.variant == "sync_trim":  # wait for the audio on the stream first, then the plain copy
            torch.cuda.current_stream().synchronize()
            probe.mark("trim_synced")
        elif probe.variant == "pinned_trim":  # an async copy into pinned memory, then wait on its event
            host = torch.empty(wav.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(wav, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            probe.mark("trim_synced")
            wav = host
        out = trim(wav, lengths)
        probe.mark("trim_end")
        return out

    prepare, overlapped = E.Engine._prepare, E.Engine._overlapped_decode

    def _prepare(self, *a, **k):
        out = prepare(self, *a, **k)
        probe.event("prepared")
        probe.mark("prepared")
        return out

    def _overlapped(self, *a, **k):
        out = overlapped(self, *a, **k)
        probe.event("overlap_ready")
        probe.mark("overlap_ready")
        return out

    E.Engine._prepare, E.Engine._overlapped_decode = _prepare, _overlapped

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

    E.collect, E.Engine._trim = _collect, staticmethod(_trim)
    codec_overlap.OverlappedDecode.tap = _tap
    codec_graph.CodecGraphs.decode = _decode
    codec_overlap.OverlappedDecode.finish = _finish


def eos_checkpoint(size: str, scale: float) -> Path:
    from engine.checkpoint.writer import ensure_random_checkpoint

    path = CKPT_ROOT / f"{size}-custom_voice-eos{scale:g}"
    ensure_random_checkpoint(path, size, "custom_voice", eos=True, eos_scale=scale)
    return path


def graph_ms_by_window(eng, frames=100) -> dict:
    """Warm back-to-back replays of each one-row frame graph: the pure GPU ms per frame of each window."""
    return {window: mean_gpu_ms(graph.replay, frames)
            for (batch, window), graph in sorted(eng.runner.graphs.items()) if batch == 1}


@torch.inference_mode()
def first_seen_projection(eng, lengths=(333, 517, 701, 909)) -> list:
    """Wall ms of the prompt's text projection (embed_text) at token counts no request used, first call and
    second; a gap means a per-shape cost on first use (e.g. the matmul library choosing a kernel)."""
    dev = eng.talker.model.codec_embedding.weight.device
    out = []
    for n in lengths:
        ids = torch.randint(0, 1000, (n,), device=dev)
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            eng.talker.embed_text(ids)
            torch.cuda.synchronize()
            times.append(1000 * (time.perf_counter() - t))
        out.append({"tokens": n, "first_ms": times[0], "again_ms": times[1]})
        print(f"embed_text {n} tokens: first {times[0]:.2f} ms, again {times[1]:.2f} ms", flush=True)
    return out


@torch.inference_mode()
def codec_piece_profile(eng) -> dict:
    """Kernels of one eager codec piece (1 and 32 frames, one row), grouped by name, and the graph replay."""
    graphs = eng.codec_graphs
    state = graphs.state(1)
    q = eng.codec.decoder.cfg.num_quantizers
    out = {}
    for frames in (1, 32):
        codes = torch.zeros(1, q, frames, dtype=torch.long, device="cuda")
        rows = cuda_kernels(lambda c=codes: eng.codec.decoder(c, state, check=False), width=80)
        replay = mean_gpu_ms(lambda c=codes: graphs.decode(c, state), 10)
        out[frames] = {"kernels": sum(r["count"] for r in rows), "summed_us": round(sum(r["us"] for r in rows), 1),
                       "graph_replay_ms": replay, "top": rows[:15]}
        print(f"codec piece {frames} frames: {out[frames]['kernels']} kernels, {out[frames]['summed_us']} us summed, "
              f"graph replay {replay:.2f} ms", flush=True)
        for r in rows[:15]:
            print(f"   {r['count']:4d} {r['us']:8.1f} us  {r['kernel']}")
    state.zero_()
    return out


def run_script(eng, probe, chunk: int, variant: str = "engine") -> list:
    from engine.gpu import codec_overlap

    probe.variant = variant
    stream = torch.cuda.Stream(priority=torch.cuda.Stream.priority_range()[1]) if variant == "hi_stream" \
        else torch.cuda.current_stream()
    from engine import decode

    flush, rows = getattr(codec_overlap, "FLUSH_FRAMES", None), decode.decode_rows
    if variant.startswith("flush"):
        codec_overlap.FLUSH_FRAMES = int(variant[5:])
    if variant == "no_overlap":  # every frame waits for the end: the codec runs after the last frame only
        codec_overlap.FLUSH_FRAMES = NO_FLUSH
    if variant == "no_prelaunch":
        decode.decode_rows = lambda *a, **k: rows(*a, **{**k, "prelaunch": False, "ahead": False})
    if variant == "no_ahead":  # prelaunch only: the GPU drains at each chunk's host sync
        decode.decode_rows = lambda *a, **k: rows(*a, **{**k, "ahead": False})
    try:
        return _run_script(eng, probe, chunk, stream)
    finally:
        codec_overlap.FLUSH_FRAMES, decode.decode_rows = flush, rows


def _run_script(eng, probe, chunk, stream) -> list:
    from engine import Request

    rows = []
    for i, (lang, text, frames) in enumerate(script()):
        params = script_params(eng, frames)
        req = Request(mode="custom", text=text, language=lang, speaker=SPEAKER)
        probe.reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            probe.event("start")
            res = eng.generate(req, takes=1, seed=i, params=params, progress_every=chunk)
            t1 = time.perf_counter()
        torch.cuda.synchronize()
        ev, h = probe.events, probe.host
        gpu = {k: ev["start"].elapsed_time(e) for k, e in ev.items()}
        pieces = [(f, fin, ev["start"].elapsed_time(a), a.elapsed_time(b)) for f, fin, a, b in probe.pieces]
        last_frame = gpu["last_frame"]
        row = {
            "i": i, "frames": res.stats["frames_per_take"][0], "budget": frames, "tokens": res.stats["prompt_tokens"],
            "wall_ms": 1000 * (t1 - t0),
            "prefill_ms": 1000 * res.stats["prefill_s"],
            "gpu_last_frame_ms": last_frame, "gpu_audio_ready_ms": gpu["audio_ready"],
            "host_collected_ms": 1000 * (h["collected"] - t0), "host_finish_ms": 1000 * (h["finish"] - t0),
            "host_trim_ms": 1000 * (h["trim_end"] - h["trim_start"]),
            "host_after_trim_ms": 1000 * (t1 - h["trim_end"]),
            "host_prepared_ms": 1000 * (h["prepared"] - t0), "gpu_prepared_ms": gpu["prepared"],
            "host_overlap_ready_ms": 1000 * (h["overlap_ready"] - t0), "gpu_overlap_ready_ms": gpu["overlap_ready"],
            "trim_wait_ms": 1000 * (h["trim_synced"] - h["trim_start"]) if "trim_synced" in h else None,
            "chunk_gaps_ms": [1000 * (b - a) for a, b in zip(probe.chunks, probe.chunks[1:])],
            "pieces": pieces, "gc_ms": probe.gc_ms,
        }
        # the side pieces still running after the last frame, and the final piece
        row["side_after_last_frame_ms"] = max([s + d for _, fin, s, d in pieces if not fin] + [last_frame]) - last_frame
        row["final_piece_ms"] = sum(d for _, fin, _, d in pieces if fin)
        row["tail_ms"] = row["wall_ms"] - last_frame
        rows.append(row)
        print(f"{row['frames']:4d}/{frames:4d} f {row['tokens']:4d} tok  wall {row['wall_ms']:7.1f}  "
              f"prefill {row['prefill_ms']:4.1f}  "
              f"last frame {last_frame:7.1f}  audio ready {gpu['audio_ready']:7.1f}  tail {row['tail_ms']:5.1f} "
              f"(side lag {row['side_after_last_frame_ms']:4.1f}, final piece {row['final_piece_ms']:4.1f}, "
              f"trim {row['host_trim_ms']:4.1f})  gc {probe.gc_ms:4.1f}  pieces "
              + " ".join(f"{f}{'F' if fin else ''}@{s:.0f}+{d:.1f}" for f, fin, s, d in pieces), flush=True)
    return rows


COLS = ["wall_ms", "overhead_vs_graph_ms", "host_prepared_ms", "host_overlap_ready_ms", "prefill_ms", "bubble_ms", "bubble_per_frame_ms", "tail_ms",
        "side_after_last_frame_ms", "final_piece_ms", "host_trim_ms", "gc_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", nargs="+", default=["engine"],
                    choices=["engine", "sync_trim", "pinned_trim", "hi_stream", "no_prelaunch", "no_ahead",
                             "no_overlap", "flush8", "flush16", "flush32"],
                    help="engine: as shipped; sync_trim / pinned_trim: other ways to wait for and copy the audio; "
                         "hi_stream: the request on a high-priority stream (the codec's side stream stays low); "
                         "no_prelaunch: decode_rows without launching each next chunk's first frame early; "
                         "no_ahead: that frame launched after the chunk's host sync, not before it; "
                         "flushN: side-stream codec pieces of N frames; no_overlap: the whole codec after the "
                         "last frame (what the frames cost without the codec beside them)")
    ap.add_argument("--first-seen", action="store_true",
                    help="also time the prompt's text projection at lengths never seen, first call and again")
    ap.add_argument("--codec-profile", action="store_true",
                    help="also profile one codec piece of 1 and of 32 frames (kernels, device time)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[4],
                    help="progress_every values (frames per host sync); the script runs once per value, "
                         "the first in order (every length new), the others on lengths already seen")
    ap.add_argument("--eos-scale", type=float, default=None,
                    help="a checkpoint whose EOS logit is left on and scaled by this (random weights: requests end "
                         "by EOS at random frames, the same in every variant); default: EOS off, fixed lengths")
    args = ap.parse_args()

    from engine import Engine

    ckpt = checkpoint(args.size) if args.eos_scale is None else eos_checkpoint(args.size, args.eos_scale)
    t = time.perf_counter()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t
    probe = Probe()
    install(probe)
    runs = {f"{variant}/{chunk}": run_script(eng, probe, chunk, variant)
            for variant in args.variants for chunk in args.chunks}

    if args.first_seen:
        out_first = first_seen_projection(eng)
    if args.codec_profile:
        out_codec = codec_piece_profile(eng)
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
        summary = {c: {"p50": percentile([r[c] for r in rows], 50), "p95": percentile([r[c] for r in rows], 95),
                       "max": max(r[c] for r in rows)} for c in COLS}
        print(f"--- variant/progress_every {chunk}")
        for c in COLS:
            s = summary[c]
            print(f"{c:28s} p50 {s['p50']:7.2f}  p95 {s['p95']:7.2f}  max {s['max']:7.2f}")
        out["runs"][chunk] = {"rows": rows, "summary": summary}
    if args.first_seen:
        out["first_seen_projection"] = out_first
    if args.codec_profile:
        out["codec_piece_profile"] = out_codec
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
