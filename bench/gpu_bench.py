"""GPU benchmark: this engine against faster-qwen3-tts 0.5.4 and the official package, in one run.

    python bench/gpu_bench.py --out DIR [--sizes 0.6b 1.7b] [--frames 250] [--skip-faster] [--skip-official]

Builds real-size random checkpoints (EOS disabled, so every run decodes exactly --frames frames), then
runs each engine in its own subprocess (clean peak-memory numbers, no import interference) and writes
DIR/gpu.json and DIR/gpu.md. faster-qwen3-tts and the official reference need qwen-tts-hf, librosa,
soundfile... importable (the device command installs them from carried wheels into PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from timing import (  # bench/ is on sys.path when a bench runs
    best_of,
    run_fresh,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("The old lighthouse keeper climbed the narrow stairs every evening, lit the great lamp, "
        "and watched the ships pass safely through the storm.")  # 24 words
CKPT_ROOT = Path(os.environ.get("BENCH_CKPT_DIR", "/tmp/qwen3tts-bench-ckpt"))


def checkpoint(size: str, model_type: str = "custom_voice") -> Path:
    sys.path.insert(0, str(ROOT))
    from engine.checkpoint.writer import ensure_random_checkpoint

    path = CKPT_ROOT / f"{size}-{model_type}"
    t = time.perf_counter()
    if ensure_random_checkpoint(path, size, model_type):
        print(f"built {path.name} in {time.perf_counter() - t:.1f} s", flush=True)
    return path


# ---------------------------------------------------------------------------------------------
# Engines, each run in a subprocess: `python gpu_bench.py --worker NAME --ckpt DIR --frames N`


def _sync():
    import torch

    torch.cuda.synchronize()


def _mem():
    import torch

    return {"peak_alloc_gb": torch.cuda.max_memory_allocated() / 1e9,
            "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1e9}


def worker_ours(ckpt: Path, frames: int, takes_list, mode: str, triton: str = "auto", engine_root: Path = ROOT) -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, str(engine_root))
    from engine import Engine, Request

    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    eng = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton=triton, max_seq_len=1024,
                      max_takes=max(16, *takes_list))
    load_s = time.perf_counter() - t
    runner = eng.runner
    out = {"engine": f"ours (triton {triton})", "load_s": load_s, "info": eng.info.summary(), "notes": eng.info.notes,
           "kernels": eng.info.kernels,
           "warmup_capture_s": runner.capture_seconds}
    voice = None
    if mode == "clone":
        wav = (0.3 * np.sin(2 * np.pi * 180 * np.arange(3 * 24000) / 24000)).astype(np.float32)
        voice = eng.extract_voice(wav, 24000, ref_text="A short reference sentence for the voice.")
        req = Request(mode="clone", text=TEXT, language="English", voice=voice)
    else:
        req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    params = eng.defaults.replace(max_new_tokens=frames)
    rows = {}
    for takes in takes_list:
        before = runner.capture_seconds
        eng.generate(req, takes=takes, seed=1, params=params)  # first run per bucket captures its graphs
        capture = runner.capture_seconds - before
        if takes == 1:
            out["mem_b1"] = _mem()

        def timed(rep, takes=takes, capture=capture):
            _sync()
            t0 = time.perf_counter()
            res = eng.generate(req, takes=takes, seed=rep, params=params)
            wall = time.perf_counter() - t0
            st = res.stats
            assert all(n == frames * 1920 for n in res.lengths), res.lengths
            return {"decode_ms_per_frame": 1000 * (st["decode_s"] - st["prefill_s"]) / frames,
                    "e2e_ms_per_frame": 1000 * wall / frames, "prefill_ms": 1000 * st["prefill_s"],
                    "codec_ms": 1000 * st["codec_s"], "rtf": (frames * 1920 / 24000) / wall,
                    "aggregate_rtf": takes * (frames * 1920 / 24000) / wall, "capture_s": capture}

        best = best_of(timed, key=lambda row: row["e2e_ms_per_frame"])
        rows[str(takes)] = best
        print(json.dumps({"takes": takes, **best}), flush=True)
    out["takes"] = rows
    out["mem_all"] = _mem()
    for chunk in (4, 8) if 1 in takes_list else ():

        def first_audio_s(rep, chunk=chunk):
            _sync()
            gen = eng.stream(req, takes=1, seed=rep, params=params.replace(max_new_tokens=max(chunk * 3, 24)),
                             chunk_frames=chunk)
            ttfa = next(gen).elapsed_s
            for _ in gen:
                pass
            return ttfa

        out[f"ttfa_chunk{chunk}_ms"] = 1000 * best_of(first_audio_s)
    out["kernels_per_frame"] = count_kernels(eng)
    return out


def count_kernels(eng) -> int:
    """CUDA kernels launched by one frame body (the graph replays exactly these)."""
    from profile_frame import kernel_table

    return sum(r["count"] for r in kernel_table(eng))


def _patch_tf5_rope():
    """qwen-tts-hf on transformers >= 5.17: fall back to rope_parameters when a config has no rope_theta."""
    from transformers import modeling_rope_utils as mru

    original = mru.ROPE_INIT_FUNCTIONS["default"]

    def default(config=None, *args, **kwargs):
        if config is not None and not hasattr(config, "rope_theta"):
            params = getattr(config, "rope_parameters", None) or {}
            if "rope_theta" in params:
                config.rope_theta = params["rope_theta"]
        return original(config, *args, **kwargs)

    mru.ROPE_INIT_FUNCTIONS["default"] = default


def worker_faster(ckpt: Path, frames: int) -> dict:
    import qwen_tts  # noqa: F401  (qwen-tts-hf)
    import torch
    _patch_tf5_rope()
    from faster_qwen3_tts import FasterQwen3TTS

    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model = FasterQwen3TTS.from_pretrained(str(ckpt), device="cuda", dtype=torch.bfloat16, max_seq_len=2048)
    out = {"engine": "faster-qwen3-tts 0.5.4", "load_s": time.perf_counter() - t}
    t = time.perf_counter()
    model.generate_custom_voice(TEXT, "ryan", "English", max_new_tokens=24, min_new_tokens=24)
    out["warmup_capture_s"] = time.perf_counter() - t
    def timed(_rep):
        _sync()
        t0 = time.perf_counter()
        wavs, sr = model.generate_custom_voice(TEXT, "ryan", "English", max_new_tokens=frames, min_new_tokens=frames)
        wall = time.perf_counter() - t0
        n = len(wavs[0]) // 1920
        return {"e2e_ms_per_frame": 1000 * wall / n, "frames": n, "rtf": (len(wavs[0]) / 24000) / wall}

    out["b1"] = best_of(timed, key=lambda row: row["e2e_ms_per_frame"])
    out["mem_b1"] = _mem()
    for chunk in (4, 8):

        def first_audio_s(_rep, chunk=chunk):
            _sync()
            t0 = time.perf_counter()
            gen = model.generate_custom_voice_streaming(TEXT, "ryan", "English", max_new_tokens=max(24, 3 * chunk),
                                                        min_new_tokens=max(24, 3 * chunk), chunk_size=chunk)
            next(gen)
            ttfa = time.perf_counter() - t0
            for _ in gen:
                pass
            return ttfa

        out[f"ttfa_chunk{chunk}_ms"] = 1000 * best_of(first_audio_s)
    print(json.dumps(out), flush=True)
    return out


def worker_official(ckpt: Path, frames: int) -> dict:
    import qwen_tts
    import torch
    _patch_tf5_rope()

    model = qwen_tts.Qwen3TTSModel.from_pretrained(str(ckpt), device_map="cuda", dtype=torch.bfloat16)
    model.generate_custom_voice(text=TEXT, language="English", speaker="ryan", max_new_tokens=4)
    _sync()
    t0 = time.perf_counter()
    wavs, sr = model.generate_custom_voice(text=TEXT, language="English", speaker="ryan", max_new_tokens=frames + 1)
    wall = time.perf_counter() - t0
    n = len(wavs[0]) // 1920
    return {"engine": "official qwen-tts(-hf) 0.1.1", "frames": n, "e2e_ms_per_frame": 1000 * wall / n,
            "rtf": (len(wavs[0]) / 24000) / wall}


def run_worker(name: str, ckpt: Path, frames: int, extra=()) -> dict:
    out = run_fresh(__file__, ["--worker", name, "--ckpt", str(ckpt), "--frames", str(frames), *extra], timeout=900)
    return {"engine": name, **out} if "error" in out else out


def table(results: dict) -> str:
    kern = []
    for key, r in results.items():
        for name in ("ours", "ours_no_triton"):
            if "kernels_per_frame" in r.get(name, {}):
                kern.append(f"{key} {r[name]['engine']}: {r[name]['kernels_per_frame']} kernels/frame")
    lines = ["| model | engine | B | decode ms/frame | e2e ms/frame | RTF (per take) | aggregate RTF | "
             "TTFA chunk 4 / 8 | peak mem B=1 (alloc/reserved GB) | capture s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        ours = r.get("ours", {})
        for takes, row in ours.get("takes", {}).items():
            ttfa = f"{ours.get('ttfa_chunk4_ms', 0):.0f} / {ours.get('ttfa_chunk8_ms', 0):.0f} ms" if takes == "1" else ""
            mem = ours.get("mem_b1", {})
            memtxt = f"{mem.get('peak_alloc_gb', 0):.2f} / {mem.get('peak_reserved_gb', 0):.2f}" if takes == "1" else ""
            lines.append(f"| {key} | ours | {takes} | {row['decode_ms_per_frame']:.2f} | {row['e2e_ms_per_frame']:.2f} "
                         f"| {row['rtf']:.1f} | {row['aggregate_rtf']:.1f} | {ttfa} | {memtxt} | {row['capture_s']:.2f} |")
        nt = r.get("ours_no_triton", {})
        if "1" in nt.get("takes", {}):
            row = nt["takes"]["1"]
            lines.append(f"| {key} | ours, graphs only (no Triton) | 1 | {row['decode_ms_per_frame']:.2f} | "
                         f"{row['e2e_ms_per_frame']:.2f} | {row['rtf']:.1f} | {row['aggregate_rtf']:.1f} | "
                         f"{nt.get('ttfa_chunk4_ms', 0):.0f} / {nt.get('ttfa_chunk8_ms', 0):.0f} ms | | |")
        f = r.get("faster", {})
        if "b1" in f:
            mem = f["mem_b1"]
            lines.append(f"| {key} | faster-qwen3-tts 0.5.4 | 1 | – | {f['b1']['e2e_ms_per_frame']:.2f} | "
                         f"{f['b1']['rtf']:.1f} | {f['b1']['rtf']:.1f} | {f['ttfa_chunk4_ms']:.0f} / "
                         f"{f['ttfa_chunk8_ms']:.0f} ms | {mem['peak_alloc_gb']:.2f} / {mem['peak_reserved_gb']:.2f} "
                         f"| {f['warmup_capture_s']:.2f} |")
        o = r.get("official", {})
        if "e2e_ms_per_frame" in o:
            lines.append(f"| {key} | official 0.1.1 ({o['frames']} frames) | 1 | – | {o['e2e_ms_per_frame']:.1f} | "
                         f"{o['rtf']:.2f} | {o['rtf']:.2f} | – | – | – |")
    return "\n".join(lines) + ("\n\n" + "; ".join(kern) if kern else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--mode", default="custom")
    ap.add_argument("--triton", default="auto")
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    ap.add_argument("--official-frames", type=int, default=50)
    ap.add_argument("--skip-faster", action="store_true")
    ap.add_argument("--skip-official", action="store_true")
    ap.add_argument("--skip-no-triton", action="store_true", help="skip the graphs-only (Triton off) row")
    ap.add_argument("--clone", action="store_true", help="also time the 0.6B Base clone path")
    ap.add_argument("--engine-root", type=Path, default=ROOT,
                    help="import our `engine` from this tree (a before/after run; PYTHONPATH does not do it: "
                         "the worker puts its own tree first)")
    args = ap.parse_args()
    if args.worker == "ours":
        print(json.dumps(worker_ours(args.ckpt, args.frames, args.takes, args.mode, args.triton, args.engine_root)))
        return
    if args.worker == "faster":
        worker_faster(args.ckpt, args.frames)
        return
    if args.worker == "official":
        print(json.dumps(worker_official(args.ckpt, args.frames)))
        return

    results = {}
    for size in args.sizes:
        ckpt = checkpoint(size)
        r = results[f"{size} CustomVoice"] = {}
        root = ["--engine-root", str(args.engine_root)]
        r["ours"] = run_worker("ours", ckpt, args.frames, ["--takes", *map(str, args.takes), *root])
        if not args.skip_no_triton:
            r["ours_no_triton"] = run_worker("ours", ckpt, args.frames, ["--takes", "1", "--triton", "off", *root])
        if not args.skip_faster:
            r["faster"] = run_worker("faster", ckpt, args.frames)
        if not args.skip_official:
            r["official"] = run_worker("official", ckpt, args.official_frames)
        print(json.dumps({size: r}), flush=True)
    if args.clone:
        ckpt = checkpoint("0.6b", "base")
        results["0.6b Base (ICL clone)"] = {"ours": run_worker("ours", ckpt, args.frames,
                                                                ["--takes", "1", "8", "--mode", "clone",
                                                                 "--engine-root", str(args.engine_root)])}
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": "bf16",
            "frames": args.frames, "text_words": len(TEXT.split()), "date": time.strftime("%Y-%m-%d"),
            "engine_root": str(args.engine_root)}
    write_json(args.out / "gpu.json", {"meta": meta, "results": results})
    (args.out / "gpu.md").write_text(f"{meta['gpu']}, torch {meta['torch']}, bf16, {args.frames} frames "
                                     f"(EOS disabled), best of 3.\n\n{table(results)}\n")
    print(table(results))


if __name__ == "__main__":
    main()
