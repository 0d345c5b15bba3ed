"""Serving benchmark: the speech server (`python -m engine serve`) under Poisson arrivals of the real-length
sentence mix, under a closed loop of many streams, and one request at a time against the engine in-process.

    python bench/serve_bench.py --out DIR [--configs 0.6b:custom_voice 1.7b:custom_voice 0.6b:base | --model DIR]
        [--rates 1 5 10 20 40] [--duration 10] [--requests 0] [--saturation 64] [--saturation-s 10] [--alone 8]
        [--clone saved|upload] [--device cuda] [--max-rows 16] [--boundary-frames 2] [ANY OTHER SERVE OPTION]

Each config gets a fresh server process (options the bench does not know go to it unchanged). `--configs`
writes real-size random checkpoints (EOS disabled, in $BENCH_CKPT_DIR like the other benches), so each request
decodes exactly its `max_new_tokens`, which the bench sets to its sentence's natural length
(bench/real_length_script.py: 40 sentences of 1 to 28 s, 7.3 s on average). Base checkpoints clone in context
from example_workflows/qwen3tts_reference.ogg: a voice saved once (`--clone saved`, served from `--voices`), or
the clip uploaded with every request (`--clone upload`, the server extracts it each time).

Every request streams (`stream: true`, chunked PCM). Per request the client keeps the send time, the first
audio byte and each chunk's arrival and size. Per arrival rate: requests sent for `--duration` s (or
`--requests`), then every answer awaited; first audio p50/p95, the p95 gap between chunks, underruns (playback
starts when the first chunk arrives; a chunk that comes after the audio before it has played is one),
success (200 and every frame), throughput (s of audio received per s from the first send to the last byte)
and the server's /health afterwards. Saturation: `--saturation` streams, each sending its next request when the
last ends, for `--saturation-s` s: s of audio received per s. Alone: `--alone` sentences one at a time through
the server (each on a new connection, then all on one kept alive), then through Engine.stream in a fresh process
loaded the same way; the difference of first audio is the server's overhead (HTTP, the scheduler, the PCM
conversion), and each response's Server-Timing splits it into the server's steps and what lies outside them.

Writes DIR/serve_<name>.md (the tables, also printed), DIR/serve_<name>.json (the figures) and
DIR/serve_<name>_requests.json.gz (every request's record).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from pathlib import Path

from real_length_script import script
from serve_client import (
    BYTES_PER_S,
    FRAME_BYTES,
    ServerProcess,
    gaps_ms,
    health,
    session,
    speech,
    underruns,
    wait_idle,
)
from timing import percentile, run_fresh, write_json

ROOT = Path(__file__).resolve().parents[1]
SPEAKER = "ryan"
WARM_TEXT = ("English", "Hello there, this is a warm-up.", 13)
ALONE_CONNECTIONS = ("new", "kept")  # the alone phase's clients: a connection per request, or one kept alive
PUBLISHED = [  # not measured here: the peers' own figures on one H100
    ("Nari Labs qwen3-tts, 1.7B CustomVoice, one H100 (sglang-omni #1754): p95 first audio 32.8 ms at 10 req/s "
    "with 0% underrun; under 80 ms at 20 req/s with 100% success."),
    ("vLLM-Omni, 1.7B Base, one H100 (vllm-omni PR #7781): 111.9 s of audio per s at 64 concurrent requests, "
    "median first audio 353 ms."),
]


# ---------------------------------------------------------------------------------------------
# Requests


class Mix:
    """The real-length sentences in order, round and round, each request with its own seed; `body(i)` is the
    i-th request of a config (the same i gives the same request at every rate)."""

    def __init__(self, mode: str, voice: str | None, upload: str | None):
        self.sentences = script()
        self.mode, self.voice, self.upload = mode, voice, upload

    def body(self, i: int, sentence=None) -> tuple[dict, int]:
        language, text, frames = sentence or self.sentences[i % len(self.sentences)]
        body = {"input": text, "language": language, "stream": True, "seed": max(i, 0), "max_new_tokens": frames}
        if self.upload is not None:
            body.update(voice="", reference_audio=self.upload, reference_text=self.upload_text)
        else:
            body["voice"] = self.voice
        return body, frames

    upload_text = None


def _ok(rec: dict, frames: int, exact: bool) -> bool:
    full = rec["bytes"] == frames * FRAME_BYTES if exact else rec["bytes"] > 0
    return rec["status"] == 200 and rec["done"] and full


def summarise(recs: list, exact: bool, t0: float, window_end: float | None = None) -> dict:
    """The figures of one phase; `recs` are (record, frames) pairs. window_end: count audio that arrived before
    it, over the time from t0 to it (saturation), else all audio over t0 to the last byte."""
    answered = [r for r, _ in recs if r["status"] == 200 and r["first"] is not None]
    first = [1000 * (r["first"] - r["sent"]) for r in answered]
    gaps = [g for r in answered for g in gaps_ms(r["chunks"])]
    stalls = [underruns(r["chunks"]) for r in answered]
    arrivals = [c for r in answered for c in r["chunks"]]
    if window_end is None:
        window_end = max((c[0] for c in arrivals), default=t0)
    audio_s = sum(n for t, n in arrivals if t <= window_end) / BYTES_PER_S
    out = {"requests": len(recs), "succeeded": sum(_ok(r, f, exact) for r, f in recs),
           "rejected_503": sum(r["status"] == 503 for r, _ in recs),
           "failed_other": sum(r["status"] not in (200, 503) or r["error"] is not None for r, _ in recs),
           "audio_s": audio_s, "window_s": window_end - t0,
           "audio_s_per_s": audio_s / (window_end - t0) if window_end > t0 else 0.0}
    out["success_rate"] = out["succeeded"] / max(1, len(recs))
    if answered:
        out.update(first_audio_p50_ms=percentile(first, 50), first_audio_p95_ms=percentile(first, 95),
                   gap_p95_ms=percentile(gaps, 95) if gaps else None,
                   underrun_requests=sum(s > 0 for s in stalls), underrun_events=sum(stalls))
    return out


async def open_loop(url: str, mix: Mix, rate: float, duration: float, max_requests: int, exact: bool,
                    rng: random.Random) -> tuple[dict, list]:
    """Poisson arrivals at `rate` per s for `duration` s (at most max_requests, 0: no cap); every answer awaited."""
    async with session() as client:
        tasks, t0 = [], time.perf_counter()
        at = t0
        while True:
            at += rng.expovariate(rate)
            if at - t0 > duration or (max_requests and len(tasks) >= max_requests):
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            body, frames = mix.body(len(tasks))
            tasks.append((asyncio.create_task(speech(client, url, body)), frames))
        recs = [(await task, frames) for task, frames in tasks]
        out = summarise(recs, exact, min((r["sent"] for r, _ in recs), default=t0))  # from the first send
        out["health_after"] = await health(client, url)
        await wait_idle(client, url)
    return out, recs


async def closed_loop(url: str, mix: Mix, streams: int, seconds: float, exact: bool,
                      loop_cpu_s=lambda: None) -> tuple[dict, list]:
    """`streams` clients, each sending its next request as its last ends, for `seconds`; the requests still
    running then are closed, and the audio that came by then counts. `loop_cpu_s()`: the server's event loop's
    CPU seconds so far (ServerProcess.loop_cpu_s), read at both ends of the window: how busy the loop was, and
    its CPU time per HTTP chunk sent."""
    recs, counter = [], iter(range(1 << 30))

    async def client_loop(client):
        while True:
            body, frames = mix.body(next(counter))
            rec = {}
            recs.append((rec, frames))
            await speech(client, url, body, rec=rec)
            if rec["status"] == 503:
                await asyncio.sleep(1.0)  # Retry-After: 1

    async with session() as client:
        t0, cpu0 = time.perf_counter(), loop_cpu_s()
        tasks = [asyncio.create_task(client_loop(client)) for _ in range(streams)]
        await asyncio.sleep(seconds)
        end, cpu1 = time.perf_counter(), loop_cpu_s()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for rec, _ in recs:  # the requests cut at the end: what they received counts, not their outcome
            rec.setdefault("status", None)
            rec.setdefault("done", False)
        finished = [(r, f) for r, f in recs if r["done"]]
        out = summarise(recs, exact, t0, window_end=end)
        out.update(streams=streams, requests_finished=len(finished),
                   failed_other=sum(r["status"] not in (200, 503) or r["error"] is not None for r, _ in finished),
                   success_rate=sum(_ok(r, f, exact) for r, f in finished) / max(1, len(finished)))
        if cpu0 is not None and cpu1 is not None:
            chunks = sum(t0 <= t <= end for r, _ in recs for t, _ in r["chunks"])
            out.update(loop_busy=(cpu1 - cpu0) / (end - t0), loop_ms_per_chunk=1000 * (cpu1 - cpu0) / max(1, chunks),
                       chunks=chunks)
        out["health_after"] = await wait_idle(client, url)
    return out, recs


async def one_at_a_time(url: str, mix: Mix, count: int, keep_alive: bool) -> dict:
    """First audio (ms) of the first `count` sentences, one request at a time, after one warm-up request, and each
    response's Server-Timing ({step: ms}); each request on a new connection, or all on one kept alive."""
    firsts, steps = [], []
    async with session(keep_alive) as client:
        for i in [-1, *range(count)]:
            body, _ = mix.body(i, WARM_TEXT if i < 0 else None)
            rec = await speech(client, url, body)
            if rec["status"] != 200 or rec["first"] is None:
                raise SystemExit(f"a request alone failed: {rec['status']} {rec['json'] or rec['error']}")
            if i >= 0:
                firsts.append(1000 * (rec["first"] - rec["sent"]))
                steps.append(rec["server_ms"])
    return {"first_ms": firsts, "steps_ms": steps}


# ---------------------------------------------------------------------------------------------
# In-process first audio (a fresh process: `serve_bench.py --alone-worker JSON`)


def alone_worker(spec: dict) -> dict:
    """Engine.stream's first audio for the same requests, loaded as the server loads (max_takes and warm_takes
    of its rows), with the server's chunk settings."""
    sys.path.insert(0, str(ROOT))
    from engine import Engine, Request
    from engine.voice import Voice

    eng = Engine.load(spec["model"], max_takes=spec["rows"], warm_takes=spec["rows"], **spec["load"])
    voice = None
    if spec["voice_file"]:
        voice = Voice.load(spec["voice_file"])
    elif spec["upload"]:
        import torch
        from serve_voice import CLIP_TEXT, reference

        samples, rate = reference()
        voice = eng.extract_voice(torch.from_numpy(samples), rate, CLIP_TEXT)
    mode = "clone" if voice is not None else "custom"
    firsts = []
    for i, (language, text, frames) in enumerate([WARM_TEXT, *script()[:spec["count"]]]):
        req = Request(mode=mode, text=text, language=language, speaker=SPEAKER if mode == "custom" else None,
                      voice=voice)
        t0, first = time.perf_counter(), None
        for chunk in eng.stream(req, seed=max(i - 1, 0), params=eng.defaults.capped(frames), chunk_frames=spec["chunk"],
                                first_chunk_frames=spec["first_chunk"]):
            if first is None and chunk.audio.numel():
                first = time.perf_counter() - t0
        if i:
            firsts.append(1000 * first)
    return {"first_audio_ms": firsts}


# ---------------------------------------------------------------------------------------------
# A config: one model, one server


def _checkpoint(config: str) -> Path:
    from gpu_bench import checkpoint

    size, _, model_type = config.partition(":")
    return checkpoint(size, model_type or "custom_voice")


def run_config(model: Path, label: str, args, server_args: list) -> tuple[dict, list]:
    from serve_voice import CLIP_TEXT, is_base, reference_wav_base64, saved_voice

    sys.path.insert(0, str(ROOT))
    from engine.checkpoint.writer import is_random_checkpoint

    exact = is_random_checkpoint(model)  # EOS disabled: every request decodes exactly its frame count
    load = {"device": args.device, "dtype": args.dtype, "cuda_graphs": args.cuda_graphs, "triton": args.triton}
    base = is_base(model)
    voice_file, upload = None, None
    server_args = [f"--{k.replace('_', '-')}={v}" for k, v in load.items()] + server_args
    if args.batch_invariant:  # a switch of the server's; the in-process run loads with it too
        load["batch_invariant"] = True
        server_args.append("--batch-invariant")
    server_args += ["--max-queue", args.max_queue, "--chunk-frames", args.chunk_frames,
                    "--first-chunk-frames", args.first_chunk_frames]
    if base and args.clone == "saved":
        voice_file = saved_voice(model, load)
        server_args += ["--voices", voice_file.parent]
    elif base:
        upload = reference_wav_base64()
    mix = Mix("clone" if base else "custom", voice_file.stem if voice_file else (None if base else SPEAKER), upload)
    mix.upload_text = CLIP_TEXT
    label = label + (f" ICL {args.clone}" if base else "")
    out = {"label": label, "model": str(model), "random_weights": exact, "server_args": list(map(str, server_args)),
           "rates": []}
    records = []
    rng = random.Random(args.seed)
    with ServerProcess(model, server_args) as server:
        out["server_start_s"], out["serving"] = server.start_s, server.serving
        print(f"{label}: the server is up after {server.start_s:.1f} s (load and graph capture)", flush=True)
        try:
            if args.alone:
                out["alone_server"] = {kind: asyncio.run(one_at_a_time(server.url, mix, args.alone, kind == "kept"))
                                       for kind in ALONE_CONNECTIONS}
                for kind, got in out["alone_server"].items():
                    print(f"{label} alone through the server ({kind} connection), first audio ms: {got['first_ms']}",
                          flush=True)
            for rate in args.rates:
                summary, recs = asyncio.run(open_loop(server.url, mix, rate, args.duration, args.requests, exact, rng))
                out["rates"].append({"rate": rate, **summary})
                records.append({"label": label, "phase": f"rate {rate}", "requests": _plain(recs)})
                print(f"{label} {rate}/s: {json.dumps(_brief(summary))}", flush=True)
            if args.saturation:
                summary, recs = asyncio.run(closed_loop(server.url, mix, args.saturation, args.saturation_s, exact,
                                                        server.loop_cpu_s))
                out["saturation"] = summary
                records.append({"label": label, "phase": f"saturation {args.saturation}", "requests": _plain(recs)})
                print(f"{label} saturation: {json.dumps(_brief(summary))}", flush=True)
        except BaseException:
            print(server.log(60), file=sys.stderr)
            raise
    if args.alone:
        rows = int(_option(server_args, "--max-rows", 16))
        spec = {"model": str(model), "rows": rows, "load": load, "voice_file": str(voice_file) if voice_file else None,
                "upload": upload is not None, "count": args.alone, "chunk": args.chunk_frames,
                "first_chunk": args.first_chunk_frames}
        r = run_fresh(Path(__file__), ["--alone-worker", json.dumps(spec)])
        if "error" in r:
            raise SystemExit(f"the in-process run failed: {r['error']}")
        out["alone_inprocess_ms"] = r["first_audio_ms"]
    return out, records


def _option(argv: list, name: str, default):
    argv = list(map(str, argv))
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _plain(recs: list) -> list:
    """The records to keep, their times in s from the phase's first send (write_json keeps 6 digits: a
    perf_counter reading would lose its milliseconds)."""
    t0 = min((r["sent"] for r, _ in recs if "sent" in r), default=0.0)

    def since(t):
        return None if t is None else t - t0

    return [{"sent": since(r.get("sent")), "first": since(r.get("first")), "status": r.get("status"),
             "bytes": r.get("bytes"), "done": r.get("done"), "error": r.get("error"), "frames": f,
             "chunks": [[since(t), n] for t, n in r.get("chunks", [])]} for r, f in recs]


def _brief(s: dict) -> dict:
    keys = ("requests", "success_rate", "first_audio_p50_ms", "first_audio_p95_ms", "gap_p95_ms", "underrun_requests",
            "audio_s_per_s", "rejected_503")
    return {k: round(s[k], 3) if isinstance(s.get(k), float) else s.get(k) for k in keys}


# ---------------------------------------------------------------------------------------------
# The tables


def _ms(x):
    return "-" if x is None else f"{x:.1f}"


def table(results: list, args) -> str:
    lines = [("| model | load s | req/s | requests | success | first audio p50 ms | p95 ms | chunk gap p95 ms | "
             "underrun requests | underruns | audio s/s | 503 | /health after (queued, running, rows) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in results:
        phases = [(f"{r['rate']:g}", r) for r in c["rates"]]
        if "saturation" in c:
            phases.append((f"{c['saturation']['streams']} streams", c["saturation"]))
        for name, r in phases:
            h = r["health_after"]
            lines.append(f"| {c['label']} | {c['server_start_s']:.1f} | {name} | {r['requests']} | "
                         f"{100 * r['success_rate']:.1f}% | {_ms(r.get('first_audio_p50_ms'))} | "
                         f"{_ms(r.get('first_audio_p95_ms'))} | {_ms(r.get('gap_p95_ms'))} | "
                         f"{r.get('underrun_requests', '-')} | {r.get('underrun_events', '-')} | "
                         f"{r['audio_s_per_s']:.1f} | {r['rejected_503']} | {h['queued']}, {h['running']}, {h['rows']} |")
    loops = [c for c in results if "loop_busy" in c.get("saturation", {})]
    if loops:
        lines += ["", "The server's event loop while saturated (its main thread's CPU time from /proc: HTTP, the "
                  "chunks' conversion to PCM and their writes; with --ray also the replicas' streamed responses). "
                  "A second GPU's chunks pass through this one loop too:", "",
                  "| model | HTTP chunks sent | loop busy | loop CPU ms per chunk |", "|---|---|---|---|"]
        for c in loops:
            r = c["saturation"]
            lines.append(f"| {c['label']} | {r['chunks']} | {100 * r['loop_busy']:.0f}% | "
                         f"{r['loop_ms_per_chunk']:.3f} |")
    alone = [c for c in results if "alone_server" in c]
    if alone:
        lines += ["", "One request at a time (first audio, ms), each on a new connection or all on one kept alive; "
                  "the server's steps from its Server-Timing, and what is left outside them (the client, the "
                  "connection, the server's reading of the request and writing of the first chunk):", "",
                  "| model | connection | requests | server p50 | in-process p50 | overhead p50 | server max | "
                  "in-process max | parse / submit / audio p50 | outside p50 |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in alone:
            e = c["alone_inprocess_ms"]
            for kind, got in c["alone_server"].items():
                s, steps = got["first_ms"], got["steps_ms"]
                over = [a - b for a, b in zip(s, e)]
                split = " / ".join(f"{percentile([st.get(k, 0.0) for st in steps], 50):.2f}"
                                   for k in ("parse", "submit", "audio"))
                outside = percentile([a - sum(st.values()) for a, st in zip(s, steps)], 50)
                lines.append(f"| {c['label']} | {kind} | {len(s)} | {percentile(s, 50):.1f} | "
                             f"{percentile(e, 50):.1f} | {percentile(over, 50):.1f} | {max(s):.1f} | {max(e):.1f} | "
                             f"{split} | {outside:.2f} |")
    lines += [""] + [f"Served: {c['serving']}." for c in results if c.get("serving")]
    lines += ["", f"Rates: Poisson arrivals for {args.duration:g} s each"
                  + (f" (at most {args.requests} requests)" if args.requests else "")
              + f"; saturation: {args.saturation} closed-loop streams for {args.saturation_s:g} s. "
                "Published figures, not measured here:"]
    lines += [f"- {p}" for p in PUBLISHED]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    # A run stopped by `timeout` (SIGTERM) unwinds like Ctrl-C: the server is stopped and its log shown.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alone-worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, action="append", default=[], help="a checkpoint folder (repeatable)")
    ap.add_argument("--configs", nargs="+", default=[],
                    help="SIZE:TYPE random checkpoints to write and serve, e.g. 0.6b:custom_voice 0.6b:base")
    ap.add_argument("--clone", default="saved", choices=("saved", "upload"), help="how Base requests give the voice")
    ap.add_argument("--rates", type=float, nargs="+", default=[1, 5, 10, 20, 40], help="arrivals per s")
    ap.add_argument("--duration", type=float, default=10.0, help="s of arrivals per rate")
    ap.add_argument("--requests", type=int, default=0, help="at most this many requests per rate (0: no cap)")
    ap.add_argument("--saturation", type=int, default=64, help="closed-loop streams (0: skip)")
    ap.add_argument("--saturation-s", type=float, default=10.0)
    ap.add_argument("--alone", type=int, default=8, help="sentences one at a time, server vs in-process (0: skip)")
    ap.add_argument("--seed", type=int, default=0, help="of the arrival times")
    ap.add_argument("--batch-invariant", action="store_true", help="the load option, for the server and the "
                                                                   "in-process run")
    for opt in ("device", "dtype", "cuda-graphs", "triton"):
        ap.add_argument(f"--{opt}", default="auto", help="the load option, for the server and the in-process run")
    ap.add_argument("--max-queue", type=int, default=128, help="the server's; above --saturation, so no stream "
                                                              "is refused")
    ap.add_argument("--chunk-frames", type=int, default=8)
    ap.add_argument("--first-chunk-frames", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="", help="file name suffix (default: the GPU's short name, or cpu)")
    args, server_args = ap.parse_known_args(argv)
    if args.alone_worker:
        print(json.dumps(alone_worker(json.loads(args.alone_worker))))
        return 0
    runs = [(m, m.name) for m in args.model] + [(_checkpoint(c), c) for c in args.configs]
    if not runs:
        ap.error("give --model DIR or --configs SIZE:TYPE")
    results, records = [], []
    name = args.name or _device_tag(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    for model, label in runs:  # the files are written after each config: a run cut short keeps the ones done
        out, recs = run_config(model, label, args, server_args)
        results.append(out)
        records += recs
        md = table(results, args)
        (args.out / f"serve_{name}.md").write_text(md)
        write_json(args.out / f"serve_{name}.json", {"configs": results, "published_not_measured": PUBLISHED,
                                                      "options": {k: str(v) for k, v in vars(args).items()}})
        write_json(args.out / f"serve_{name}_requests.json.gz", records)
    print(md)
    return 0


def _device_tag(device: str) -> str:
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    from timing import gpu_tag

    return gpu_tag()


if __name__ == "__main__":
    raise SystemExit(main())
