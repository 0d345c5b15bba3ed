"""Real-length benchmark: 40 sentences of 1 to 30 s, every length seen for the first time.

    python bench/real_length_bench.py --out DIR [--sizes 0.6b 1.7b] [--skip-faster] [--engine-root ROOT]

Each (engine, mode) runs in a FRESH subprocess, so no prompt length, frame count or chunk size has been
seen before: what a ComfyUI user gets. The script (bench/real_length_script.py) runs in order at 1 take,
at 4 takes and streaming with chunk 2 (Engine.generate / Engine.stream), and as the generator nodes run a
one-segment line at 1 and 4 takes (node1 / node4: generate of a list, the segment join and the AUDIO made) and
as the StreamChunks node streams it at its default chunk size (nodestream8: stream of a list, first chunk 2).
faster-qwen3-tts 0.5.4 runs the same sentences and frame counts (1 take, and streaming with chunk 2 up to
the first chunk) in the same run. Random real-size checkpoints
with EOS disabled make every request decode exactly its frame count.

Per mode it reports audio s / wall s, p50/p95 wall per request, p50/p95 first audio (the first streamed
chunk; the whole request when not streaming) and the request overhead = wall - frames x steady ms/frame,
where the steady ms/frame of each engine is (wall(450 frames) - wall(50 frames)) / 400, medians of 3,
measured warm in the same process after the script (the walls are kept in the JSON; `_steady` says why
this span). Writes DIR/real_length_<gpu>.json.gz (every request) and .md.
The JSON also has the SM clock, power and temperature (sampled by nvidia-smi) during each of our requests and
over the script and the steady phases, to tell a clock drift from other causes, and the Python garbage
collections during each request (--gc off runs our worker with the collector disabled, for an A/B; --clocks off
runs it without the nvidia-smi sampler, for another).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine_probe import node_generate, node_load_kwargs, script_params
from gpu_bench import TEXT, _patch_tf5_rope, checkpoint
from real_length_script import FPS, script
from timing import GcPauses, GpuClocks, gpu_tag, percentile, run_fresh, write_json

ROOT = Path(__file__).resolve().parents[1]
STEADY_TEXT = TEXT  # the 250-frame bench's line
SPEAKER = "ryan"


def summarise(rows: list, steady_ms: float, takes: int) -> dict:
    audio = sum(r["frames"] for r in rows) / FPS
    wall = sum(r["wall_s"] for r in rows)
    over = [1000 * r["wall_s"] - r["frames"] * steady_ms for r in rows]
    walls = [1000 * r["wall_s"] for r in rows]
    first = [1000 * r["first_s"] for r in rows]
    return {"requests": len(rows), "audio_s": audio, "wall_s": wall, "x_real_time": audio / wall,
            "x_real_time_all_takes": takes * audio / wall, "steady_ms_per_frame": steady_ms,
            "wall_p50_ms": percentile(walls, 50), "wall_p95_ms": percentile(walls, 95),
            "first_audio_p50_ms": percentile(first, 50), "first_audio_p95_ms": percentile(first, 95),
            "overhead_p50_ms": percentile(over, 50), "overhead_p95_ms": percentile(over, 95),
            # a check on the steady figure: the long requests' own ms a frame (their fixed costs included)
            "long_requests_ms_per_frame": [1000 * r["wall_s"] / r["frames"] for r in rows
                                           if r["frames"] >= 200 and not r.get("first_only")]}


def _steady(run, frames_hi=450, frames_lo=50, repeats=3) -> tuple[float, dict]:
    """Warm ms per frame without fixed costs: the median of `repeats` walls at each length, then the
    difference over the 400 frames between them; and the walls it came from (seconds, by frame count), so
    the figure can be checked.

    Why this span: a request's fixed-cost jitter (a few ms between identical requests) divided by the frames
    between the two lengths is the estimate's error, and a long request's overhead multiplies it back. Over
    400 frames with medians of 3 that error is small, and the longest script request lies inside the span
    instead of being extrapolated to. Each process's JSON keeps the walls."""
    run(frames_hi)
    run(frames_lo)
    walls = {frames_hi: [], frames_lo: []}
    for _ in range(repeats):  # interleaved, so a drift moves both lengths alike
        walls[frames_hi].append(run(frames_hi))
        walls[frames_lo].append(run(frames_lo))
    mid = {n: sorted(w)[len(w) // 2] for n, w in walls.items()}
    return 1000 * (mid[frames_hi] - mid[frames_lo]) / (frames_hi - frames_lo), walls


# ---------------------------------------------------------------------------------------------
# Workers (fresh subprocesses)


def worker_ours(ckpt: Path, mode: str, engine_root: Path, first_chunk: int, gc_mode: str = "default",
                rounds: int = 1, clocks_mode: str = "on") -> dict:
    import gc

    import torch

    sys.path.insert(0, str(engine_root))
    from engine import BatchItem, Engine, Request

    t = time.perf_counter()
    torch.zeros(1, device="cuda")  # the process's CUDA start, timed apart: in ComfyUI it happens at launch
    torch.cuda.synchronize()
    cuda_start_s = time.perf_counter() - t
    takes = 4 if mode in ("takes4", "node4") else 1
    # The loader node's defaults: max_takes 4, whose graphs the load captures (warm_takes, nodes/engine_cache.py;
    # trees before it captured a takes count's graphs at its first request). The engine modes of one take load
    # with the engine's own defaults; takes4 as the node does.
    load_kw = node_load_kwargs(Engine, 4) if mode.startswith("node") or takes > 1 else {}
    t = time.perf_counter()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", **load_kw)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t

    def node_stream(req, seed, params):
        """What the StreamChunks node runs for a one-segment line at its default chunk_size 8 (nodes/runner.py
        Job.stream, without ComfyUI's progress bar and the browser messages): stream of a one-item list, first
        chunk 2 frames, the chunks in play order (play_order), the AUDIO
        made at the end. Returns (first audio s, frames)."""
        from nodes.audio_utils import make_audio, play_order

        t0, first, frames, pieces = time.perf_counter(), None, 0, []
        chunks = eng.stream([BatchItem(req, takes=1, seed=seed)], params=params, chunk_frames=8,
                                  first_chunk_frames=2)
        for chunk, ready in play_order(chunks, 1, eng.sample_rate):
            if ready and first is None:
                first = time.perf_counter() - t0
            pieces += ready
            frames += chunk.codes.shape[0]
        wav = torch.cat(pieces)
        make_audio(wav.unsqueeze(0), [wav.numel()], eng.sample_rate, copy=False)
        return first, frames
    stream_kw = {"chunk_frames": 2}
    if first_chunk:
        stream_kw["first_chunk_frames"] = first_chunk

    def one(lang, text, frames, seed):
        req = Request(mode="custom", text=text, language=lang, speaker=SPEAKER)
        t0 = time.perf_counter()
        if mode == "nodestream8":
            first, n = node_stream(req, seed, script_params(eng, frames))
            wall = time.perf_counter() - t0
            extra = {}
        elif mode == "stream2":
            first, n = None, 0
            for chunk in eng.stream(req, takes=1, seed=seed, params=script_params(eng, frames), **stream_kw):
                first = chunk.elapsed_s if first is None else first
                n += chunk.codes.shape[0]
            wall = time.perf_counter() - t0
            extra = {}
        else:
            if mode.startswith("node"):
                res = node_generate(eng, req, takes, seed, script_params(eng, frames))
            else:
                res = eng.generate(req, takes=takes, seed=seed, params=script_params(eng, frames))
            wall = time.perf_counter() - t0
            first, n = wall, res.stats["frames"]
            st = res.stats
            extra = {"prompt_tokens": st["prompt_tokens"], "prefill_ms": 1000 * st["prefill_s"],
                     "codec_ms": 1000 * st["codec_s"], "codec": st.get("codec", "")}
        assert n == frames, (n, frames)
        return {"frames": frames, "wall_s": wall, "first_s": first, **extra}

    def steady_phase():
        return _steady(lambda n: one("English", STEADY_TEXT, n, seed=0)["wall_s"])

    if gc_mode == "off":  # an A/B against the collector: none runs from here to the end of the process
        gc.collect()
        gc.disable()
    rows = []
    # does the frame speed drift with the SM clock (script phase vs steady phase)? do collections stop the loop?
    with GpuClocks(enabled=clocks_mode == "on") as clocks, GcPauses() as pauses:
        t_script = time.perf_counter()
        for i, (lang, text, frames) in enumerate(script()):
            t0 = time.perf_counter()
            rows.append({"language": lang, **one(lang, text, frames, seed=i)})
            t1 = time.perf_counter()
            rows[-1]["clocks"], rows[-1]["gc"] = clocks.during(t0, t1), pauses.during(t0, t1)
            print(json.dumps(rows[-1]), flush=True)
        t_steady = time.perf_counter()
        steady, steady_walls = steady_phase()
        phases = {"script": clocks.during(t_script, t_steady), "steady": clocks.during(t_steady, time.perf_counter())}
    more = []  # the script and the steady phase again in the same process: does their gap move, or stay?
    for _ in range(rounds - 1):
        again = []
        with GcPauses() as pauses:  # per request, as in the first round (the 1.7B's later rounds ran slower)
            for i, (lang, text, frames) in enumerate(script()):
                t0 = time.perf_counter()
                again.append(one(lang, text, frames, seed=i))
                again[-1]["gc"] = pauses.during(t0, time.perf_counter())
        again_steady, again_walls = steady_phase()
        summary = summarise(again, again_steady, takes)
        more.append({"steady_walls_s": again_walls, "walls_s": [r["wall_s"] for r in again],
                     "gc": [r["gc"] for r in again],
                     **{k: summary[k] for k in ("steady_ms_per_frame", "overhead_p50_ms", "overhead_p95_ms",
                                               "long_requests_ms_per_frame")}})
    out = {"engine": "ours", "mode": mode, "takes": takes, "load_s": load_s, "cuda_start_s": cuda_start_s,
           "info": eng.info.summary(),
           "notes": eng.info.notes, "rows": rows, **summarise(rows, steady, takes), "steady_walls_s": steady_walls,
           "clocks": phases, "gc_mode": gc_mode, "clocks_mode": clocks_mode, "more_rounds": more}
    graphs = getattr(eng.runner, "graphs", {})
    out["frame_graphs"] = [list(k) for k in graphs]
    if eng.codec_graphs is not None:
        out["codec_graphs"] = eng.codec_graphs.stats()
    out["gpu_mem_reserved_gb"] = torch.cuda.memory_reserved() / 1e9
    late = getattr(eng.runner, "late_captures", None)
    if late is not None:
        out["frame_late_captures"] = late
    for key in ("prefill_ms", "codec_ms"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[f"{key}_p50"], out[f"{key}_p95"] = percentile(vals, 50), percentile(vals, 95)
    return out


def worker_faster(ckpt: Path, mode: str) -> dict:
    import qwen_tts  # noqa: F401  (qwen-tts-hf)
    import torch
    _patch_tf5_rope()
    from faster_qwen3_tts import FasterQwen3TTS

    torch.zeros(1, device="cuda")  # the CUDA start outside the load, as for ours
    torch.cuda.synchronize()
    t = time.perf_counter()
    model = FasterQwen3TTS.from_pretrained(str(ckpt), device="cuda", dtype=torch.bfloat16, max_seq_len=2048)
    load_s = time.perf_counter() - t
    model.generate_custom_voice(STEADY_TEXT, SPEAKER, "English", max_new_tokens=24, min_new_tokens=24)  # capture

    def one(lang, text, frames):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mode == "stream2":  # first chunk only: its window re-decode would dominate the rest
            gen = model.generate_custom_voice_streaming(text, SPEAKER, lang, max_new_tokens=frames,
                                                        min_new_tokens=frames, chunk_size=2)
            next(gen)
            first = time.perf_counter() - t0
            gen.close()
            return {"frames": frames, "wall_s": first, "first_s": first, "first_only": True}
        wavs, _ = model.generate_custom_voice(text, SPEAKER, lang, max_new_tokens=frames, min_new_tokens=frames)
        wall = time.perf_counter() - t0
        return {"frames": len(wavs[0]) // 1920, "wall_s": wall, "first_s": wall}

    rows = []
    for lang, text, frames in script():
        rows.append({"language": lang, **one(lang, text, frames)})
        print(json.dumps(rows[-1]), flush=True)
    steady, steady_walls = _steady(lambda n: one("English", STEADY_TEXT, n)["wall_s"]) if mode == "take1" \
        else (float("nan"), {})
    return {"engine": "faster-qwen3-tts 0.5.4", "mode": mode, "takes": 1, "load_s": load_s, "rows": rows,
            **summarise(rows, steady, 1), "steady_walls_s": steady_walls}


def run_worker(args: list) -> dict:
    t = time.perf_counter()
    out = run_fresh(__file__, args, timeout=1200)
    if "error" in out:
        return {"args": args, **out}
    out["process_s"] = time.perf_counter() - t
    return out


# ---------------------------------------------------------------------------------------------
# Report

MODES = {"take1": "1 take", "takes4": "4 takes", "stream2": "streaming, chunk 2",
         "node1": "node path, 1 take", "node4": "node path, 4 takes",
         "nodestream8": "Stream node path, chunk 8 (first 2)"}


def table(results: dict) -> str:
    lines = ["| model | engine | mode | × real time (per take / all takes) | wall p50 / p95 ms | "
             "first audio p50 / p95 ms | overhead p50 / p95 ms | steady ms/frame | load s (CUDA up) | vs faster-qwen3-tts |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size, runs in results.items():
        faster = {r["mode"]: r for r in runs if r.get("engine", "").startswith("faster") and "error" not in r}
        for r in runs:
            if "error" in r:
                lines.append(f"| {size} | {' '.join(r['args'][:4])} | | error: {r['error'][:120]} | | | | | | |")
                continue
            f = faster.get(r["mode"])
            vs = ""
            first_only = r["engine"].startswith("faster") and r["mode"] == "stream2"
            if r["engine"] != "ours" or f is None:
                pass
            elif r["mode"] == "stream2":
                vs = f"first audio p50 {f['first_audio_p50_ms'] / r['first_audio_p50_ms']:.1f}× earlier"
            else:
                vs = f"{r['x_real_time'] / f['x_real_time']:.2f}× faster"
            rt = "–" if first_only else f"{r['x_real_time']:.1f} / {r['x_real_time_all_takes']:.1f}"
            wall = "–" if first_only else f"{r['wall_p50_ms']:.0f} / {r['wall_p95_ms']:.0f}"
            over = "–" if first_only else f"{r['overhead_p50_ms']:.0f} / {r['overhead_p95_ms']:.0f}"
            steady = "–" if r["steady_ms_per_frame"] != r["steady_ms_per_frame"] else f"{r['steady_ms_per_frame']:.2f}"
            lines.append(f"| {size} | {r.get('label', r['engine'])} | {MODES[r['mode']]} | {rt} | {wall} | "
                         f"{r['first_audio_p50_ms']:.0f} / {r['first_audio_p95_ms']:.0f} | {over} | {steady} | "
                         f"{r['load_s']:.1f} | {vs} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--mode", default="take1", choices=list(MODES))
    ap.add_argument("--engine-root", type=Path, default=ROOT, help="import `engine` from here (a before/after run)")
    ap.add_argument("--label", default="", help="name of the --engine-root run in the table")
    ap.add_argument("--first-chunk", type=int, default=0, help="stream's first_chunk_frames (0: not passed)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--skip-faster", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--name", default="", help="file name suffix (default: the GPU's short name)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="our workers run the script and the steady phase this many times (the table: the first)")
    ap.add_argument("--gc", default="default", choices=("default", "off"),
                    help="off: our worker runs the script with Python's garbage collector disabled (an A/B)")
    ap.add_argument("--clocks", default="on", choices=("on", "off"),
                    help="off: no nvidia-smi samples the GPU during our worker's requests (an A/B against the "
                         "sampler's own effect on the host)")
    args = ap.parse_args()
    if args.worker == "ours":
        print(json.dumps(worker_ours(args.ckpt, args.mode, args.engine_root, args.first_chunk, args.gc,
                                     args.rounds, args.clocks)))
        return
    if args.worker == "faster":
        print(json.dumps(worker_faster(args.ckpt, args.mode)))
        return

    import torch

    gpu = torch.cuda.get_device_name(0)
    name = args.name or gpu_tag()
    meta = {"gpu": gpu, "torch": torch.__version__, "dtype": "bf16", "sentences": len(script()),
            "audio_s": sum(f for _, _, f in script()) / FPS, "date": time.strftime("%Y-%m-%d"),
            "engine_root": str(args.engine_root)}
    args.out.mkdir(parents=True, exist_ok=True)

    def write():  # after every run, so a run cut off keeps what it measured
        write_json(args.out / f"real_length_{name}.json.gz", {"meta": meta, "results": results})
        md = (f"{gpu}, torch {meta['torch']}, bf16, {meta['sentences']} sentences, {meta['audio_s']:.0f} s of "
              "audio per take (EOS disabled, frames from 2.7 words/s or 4.5 CJK chars/s), each mode in a fresh "
              f"process.\n\n{table(results)}\n")
        (args.out / f"real_length_{name}.md").write_text(md)
        return md

    results = {}
    for size in args.sizes:
        ckpt = checkpoint(size)
        runs = results[f"{size} CustomVoice"] = []
        for mode in args.modes if not args.skip_ours else ():
            extra = ["--engine-root", str(args.engine_root), "--first-chunk", str(args.first_chunk), "--gc", args.gc,
                     "--rounds", str(args.rounds), "--clocks", args.clocks]
            r = run_worker(["--worker", "ours", "--ckpt", str(ckpt), "--mode", mode, *extra])
            r["label"] = args.label or "this pack"
            runs.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "rows"}), flush=True)
            write()
        for mode in ("take1", "stream2") if not args.skip_faster else ():
            if mode in args.modes:
                r = run_worker(["--worker", "faster", "--ckpt", str(ckpt), "--mode", mode])
                runs.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "rows"}), flush=True)
                write()
    print(write())


if __name__ == "__main__":
    main()
