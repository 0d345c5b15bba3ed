"""Where a one-take request's fixed costs go: load phases, capture costs, request start, codec replays.

    python bench/profile_request.py [--size 0.6b] [--out FILE.json]

Loads a real-size random CustomVoice checkpoint (built like bench/gpu_bench.py) with the node's defaults
(bf16, graphs on, Triton auto), then measures on the GPU clock (CUDA events, each figure the median of
repeats):
  * load: weights, the warm-up request, and each kind of capture (from the engine's own counters), and
    what one capture costs without its eager warm-up (shapes already seen) against with it;
  * request start: building the prompt, open + admit (CPU), the prefill graph replay per bucket;
  * replays: each codec piece size at one take, each frame window;
  * first audio of a stream with a first chunk of 1 and of 2 frames.
Prints one JSON object (and writes it to --out).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def gpu_ms(fn, repeats=20) -> float:
    """Median GPU milliseconds of fn() (events around each call, the queue drained before each)."""
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def wall_ms(fn, repeats=20) -> float:
    """Median wall milliseconds of fn() followed by a sync."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(1000 * (time.perf_counter() - t))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from gpu_bench import checkpoint

    from engine import Engine, Request
    from engine.gpu import capture as capture_mod
    from engine.gpu.codec_graph import PIECES, CodecGraphs

    ckpt = checkpoint(args.size)
    res = {}
    t = time.perf_counter()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto")
    torch.cuda.synchronize()
    res["load_s"] = time.perf_counter() - t
    runner, codec = eng.runner, eng.codec_graphs
    res["load_notes"] = eng.info.notes
    res["load_frame_graphs_s"] = runner.capture_seconds
    res["load_prefill_graphs_s"] = runner.prefill_graphs.capture_seconds
    res["load_codec_graphs_s"] = codec.capture_seconds

    # Capture costs with and without the eager warm-up, on shapes the load already ran.
    def timed_capture(warmups):
        original = capture_mod.capture

        def patched(body, pool=None, warmups_=warmups):
            return original(body, pool, warmups=warmups_)
        import engine.gpu.codec_graph as cg
        cg.capture_graph = patched
        try:
            fresh = CodecGraphs(eng.codec.decoder)
            per = {}
            for size in PIECES:
                t0 = time.perf_counter()
                ok = fresh.capture(1, size)
                torch.cuda.synchronize()
                per[size] = (round(1000 * (time.perf_counter() - t0), 1), ok)
            fresh.release()
            return per
        finally:
            cg.capture_graph = original

    with torch.inference_mode():
        res["codec_capture_ms_warmup1_seen_shapes"] = timed_capture(1)
        res["codec_capture_ms_warmup0_seen_shapes"] = timed_capture(0)
        state = codec.states[1]
        codes = torch.zeros(1, 16, 8, dtype=torch.long, device="cuda")
        saved = state.snapshot()
        res["codec_eager_8_frames_ms"] = wall_ms(lambda: eng.codec.decoder(codes, state, check=False), 5)
        state.restore(saved)

    # Replays.
    with torch.inference_mode():
        res["codec_replay_gpu_ms"] = {size: round(gpu_ms(codec.graphs[1, size][0].replay), 3) for size in PIECES}
        res["codec_replay_wall_ms"] = {size: round(wall_ms(codec.graphs[1, size][0].replay), 3) for size in PIECES}
        state.zero_()
        pre = runner.prefill_graphs
        res["prefill_replay_gpu_ms"] = {b: round(gpu_ms(pre.graphs[b][0].replay), 3) for b in pre.graphs}
        s1 = runner.states[1]
        saved = s1.snapshot()
        res["frame_replay_gpu_ms"] = {w: round(gpu_ms(g.replay), 3) for (b, w), g in runner.graphs.items() if b == 1}
        s1.restore(saved)

    # Request start pieces (CPU wall, synced), prompt of ~30 tokens.
    req = Request(mode="custom", text="The quick brown fox jumps over the lazy dog near the river bank.",
                  language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=13)
    with torch.inference_mode():
        prompt = eng.builder.build(req)
        res["prompt_tokens"] = prompt.prefill.shape[1]
        res["build_prompt_ms"] = wall_ms(lambda: eng.builder.build(req))
        from engine import sampling
        keys = sampling.take_keys(0, range(1), "cpu")

        def start():
            runner.open(slots=1, params=params, eos_id=eng.cfg.talker.codec_eos_id, max_len=prompt.prefill.shape[1] + 13)
            runner.admit([0], prompt, keys.to("cuda"), 13)
        res["open_admit_wall_ms"] = wall_ms(start)

        def open_only():
            runner.open(slots=1, params=params, eos_id=eng.cfg.talker.codec_eos_id, max_len=prompt.prefill.shape[1] + 13)
        res["open_wall_ms"] = wall_ms(open_only)
        res["open_admit_gpu_ms"] = gpu_ms(start)

    # Whole requests: generate 13 frames (overhead = wall - 13 x frame), and first audio.
    def gen():
        eng.generate(req, seed=1, params=params)
    gen()
    res["generate_13_frames_wall_ms"] = wall_ms(gen, 10)
    st = eng.generate(req, seed=1, params=params).stats
    res["generate_13_stats_ms"] = {k: round(1000 * st[k], 2) for k in ("prefill_s", "decode_s", "codec_s", "wall_s")}
    for first in (1, 2):
        vals = []
        for i in range(15):
            t0 = time.perf_counter()
            gen_ = eng.stream(req, seed=i, params=params.replace(max_new_tokens=20), chunk_frames=2,
                              first_chunk_frames=first)
            next(gen_)
            vals.append(1000 * (time.perf_counter() - t0))
            gen_.close()
        res[f"first_audio_ms_first_chunk_{first}"] = {"p50": statistics.median(vals), "max": max(vals)}
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
