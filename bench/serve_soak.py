"""Soak of the speech server: many requests in a row against one server process, with clients that leave
mid-stream, clients that leave before their audio starts (while they wait for rows) and bad requests mixed in,
several in flight at once. Then the checks of a server that has leaked nothing:

* it is up (/health ok) and holds no request and no row (queued, running and rows all 0), and its engine
  counted no failure;
* no response was a 5xx or broke, every bad request got a 4xx JSON error naming the field at fault, and every
  request run to its end brought all of its frames (random checkpoints: EOS disabled);
* the GPU's allocated tensor bytes (/health memory) are back to their level after the warm-up;
* every completed request equals the same request served alone afterwards: the same codes (the whole requests
  ask for them: response_format json, float samples) and audio within `--pcm-tolerance` steps of 16 bits
  (`--verify N` checks N of them, 0: all).

    python bench/serve_soak.py --model DIR [--requests 1000] [--concurrency 8] [--frames 13 60] [--verify 0]
        [--device cuda] [--out DIR] [--name NAME] [ANY OTHER SERVE OPTION, e.g. --max-rows 8]

Prints a summary table and writes DIR/soak_<name>.json (and .md). Exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from real_length_script import SCRIPT
from serve_client import FRAME_BYTES, ServerProcess, health, session, speech, wait_idle
from serve_voice import is_base, saved_voice
from timing import write_json

ROOT = Path(__file__).resolve().parents[1]
COMPLETE = ("stream", "whole")  # the kinds that run to their end
KINDS = {  # kind: share of the requests
    "stream": 0.30,  # streamed to its end
    "whole": 0.15,  # not streamed: response_format json with float samples and the codes
    "leave_mid_stream": 0.15,  # the client closes the connection after part of the audio
    "leave_waiting": 0.10,  # the client closes before the audio starts (queued, or still in its prefill)
    "bad": 0.30,  # a field the server must refuse, by name
}
# A bad request: (what is wrong, a change to a good body, the field the error must name, the status).
BAD = [
    ("misspelt field", lambda b: {**b, "temprature": 0.7}, "temprature", 400),
    ("negative seed", lambda b: {**b, "seed": -1}, "seed", 400),
    ("seed as text", lambda b: {**b, "seed": "seven"}, "seed", 400),
    ("zero takes", lambda b: {**b, "takes": 0}, "takes", 400),
    ("two takes streamed", lambda b: {**b, "takes": 2, "stream": True}, "takes", 400),
    ("unknown voice", lambda b: {**b, "voice": "nobody-by-this-name"}, "voice", 400),
    ("unknown language", lambda b: {**b, "language": "Klingon"}, "language", 400),
    ("negative temperature", lambda b: {**b, "temperature": -1.0}, "temperature", 400),
    ("fractional top_k", lambda b: {**b, "top_k": 1.5}, "top_k", 400),
    ("top_p above 1", lambda b: {**b, "top_p": 2.0}, "top_p", 400),
    ("zero repetition_penalty", lambda b: {**b, "repetition_penalty": 0}, "repetition_penalty", 400),
    ("mp3", lambda b: {**b, "response_format": "mp3"}, "response_format", 400),
    ("stream as text", lambda b: {**b, "stream": "yes"}, "stream", 400),
    ("speed 2", lambda b: {**b, "speed": 2.0}, "speed", 400),
    ("empty input", lambda b: {**b, "input": "   "}, "input", 400),
    ("no input", lambda b: {k: v for k, v in b.items() if k != "input"}, "input", 400),
    ("negative first_take", lambda b: {**b, "first_take": -1}, "first_take", 400),
    ("max_new_tokens as text", lambda b: {**b, "max_new_tokens": "many"}, "max_new_tokens", 400),
    ("another model", lambda b: {**b, "model": "no-such-model"}, "model", 404),
    ("not JSON", lambda b: b"{not json", None, 400),
    ("a JSON list", lambda b: [b], None, 400),
]


def plan(n: int, rng: random.Random, frames: tuple[int, int], voice: str, leave_frames: int = 0) -> list[dict]:
    """n actions: {kind, body, frames, ...}; every body is a good request of a random line, seed and length,
    changed for a bad one. leave_frames: the length of the requests whose client leaves before any audio (0: a
    random one like the others); a long one that the server failed to cancel would hold its row long after."""
    kinds, weights = zip(*KINDS.items(), strict=True)
    actions = []
    for i in range(n):
        language, text = SCRIPT[rng.randrange(len(SCRIPT))]
        count = rng.randint(*frames)
        kind = rng.choices(kinds, weights)[0]
        body = {"input": text, "language": language, "voice": voice, "seed": rng.randrange(1 << 20),
                "max_new_tokens": count, "stream": kind != "whole"}
        if kind == "whole":
            body.update(response_format="json", sample_format="f32")
        action = {"i": i, "kind": kind, "body": body, "frames": count}
        if kind == "leave_mid_stream":
            action["stop_after"] = rng.randint(1, max(1, count - 1)) * FRAME_BYTES - 1
        elif kind == "leave_waiting":
            # half while the server reads and submits the request, half while it waits for rows or its prefill
            action["give_up_s"] = rng.uniform(0.0, 0.005 if rng.random() < 0.5 else 0.05)
            if leave_frames:
                body["max_new_tokens"] = action["frames"] = leave_frames
        elif kind == "bad":
            what, change, param, status = BAD[rng.randrange(len(BAD))]
            action.update(what=what, body=change(body), param=param, status=status)
        actions.append(action)
    return actions


def judge(action: dict, rec: dict, exact: bool) -> str | None:
    """What is wrong with one response, or None. A whole response's take is kept in rec["take"]."""
    status, kind = rec["status"], action["kind"]
    if status is not None and status >= 500:
        return f"status {status}: {rec['json']}"
    if kind == "bad":
        err = (rec["json"] or {}).get("error") if isinstance(rec["json"], dict) else None
        if status != action["status"] or not err or err.get("param") != action["param"] or not err.get("message"):
            return f"{action['what']}: expected {action['status']} naming {action['param']!r}, got {status} {rec['json']}"
        return None
    if kind == "leave_waiting":
        return None if status in (None, 200) else f"status {status}: {rec['json']}"
    if status != 200:
        return f"status {status}: {rec['json'] or rec['error']}"
    if kind == "leave_mid_stream":
        return None if rec["error"] == "left" else f"the stream ended before the client left ({rec['bytes']} bytes)"
    if not rec["done"]:
        return f"incomplete: {rec['bytes']} bytes ({rec['error']})"
    if kind == "whole":
        codes, samples = rec["take"] = whole_take(rec["pcm"])  # kept for the replay's comparison
        got, want = (len(codes) // 32, len(samples) // 4), (action["frames"], action["frames"] * FRAME_BYTES // 2)
        return None if (got == want if exact else 0 < got[1]) else f"{got} (frames, samples), expected {want}"
    want = action["frames"] * FRAME_BYTES
    if (exact and rec["bytes"] != want) or rec["bytes"] == 0:
        return f"incomplete: {rec['bytes']} of {want} bytes ({rec['error']})"
    return None


def whole_take(body: bytes) -> tuple[bytes, bytes]:
    """(codes as int16 [frames, 16], float32 samples) of a json response's only take."""
    import base64

    take = json.loads(body)["takes"][0]
    return base64.b64decode(take["codes"]), base64.b64decode(take["audio"])


async def soak(url: str, actions: list, concurrency: int, exact: bool) -> list:
    """Run the actions, `concurrency` at a time, in order; each gets its record."""
    pending = iter(actions)

    async def worker(client):
        for action in pending:
            action["rec"] = await speech(client, url, action["body"], stop_after=action.get("stop_after"),
                                         give_up_s=action.get("give_up_s"), keep=action["kind"] in COMPLETE)
            action["problem"] = judge(action, action["rec"], exact)

    async with session() as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return actions


async def warm_up(url: str, voice: str, frames: tuple[int, int], concurrency: int) -> None:
    """Requests of the soak's shortest and longest length, alone and `concurrency` at once, and one in each
    language of the mix, so whatever the server allocates once (the graphs of as many rows as the soak holds at
    once; each language's tag embeddings, made at its first prompt) has been allocated before the memory
    baseline."""
    async with session() as client:
        for count in frames:
            body = {"input": "A warm-up line.", "voice": voice, "max_new_tokens": count, "stream": True}
            await speech(client, url, body)
            await asyncio.gather(*(speech(client, url, {**body, "seed": s}) for s in range(concurrency)))
        for language, text in {language: text for language, text in SCRIPT}.items():
            await speech(client, url, {"input": text, "language": language, "voice": voice,
                                       "max_new_tokens": frames[0], "stream": True})
        await wait_idle(client, url)


def pcm_difference(a: bytes, b: bytes, sample: str = "<i2") -> int | None:
    """The largest difference of two bodies of samples (16-bit PCM, or "<f4" floats in [-1, 1]), in steps of
    16 bits (None: lengths differ)."""
    import numpy as np

    if len(a) != len(b):
        return None
    x, y = np.frombuffer(a, sample).astype(np.float64), np.frombuffer(b, sample).astype(np.float64)
    scale = 32768 if sample == "<f4" else 1
    return int(np.ceil(np.abs(x - y).max() * scale)) if x.size else 0


async def replay(url: str, actions: list) -> list:
    """Each action's request again, one at a time: [(action index, its largest sample difference in 16-bit
    steps (None: the replay failed or its length differs), its codes equal (None: a stream, which has none))]."""
    out = []
    async with session() as client:
        for a in actions:
            rec = await speech(client, url, a["body"], keep=True)
            if rec["status"] != 200 or not rec["done"]:
                out.append((a["i"], None, None))
            elif a["kind"] == "whole":
                (codes, samples), (codes0, samples0) = whole_take(rec["pcm"]), a["rec"]["take"]
                out.append((a["i"], pcm_difference(samples, samples0, "<f4"), codes == codes0))
            else:
                out.append((a["i"], pcm_difference(rec["pcm"], a["rec"]["pcm"]), None))
    return out


async def final_health(url: str) -> dict:
    async with session() as client:
        return await wait_idle(client, url, timeout=60)


async def now_health(url: str) -> dict:
    async with session() as client:
        return await health(client, url)


def run(args, server_args: list) -> dict:
    sys.path.insert(0, str(ROOT))
    from engine.checkpoint.writer import is_random_checkpoint

    model = args.model
    exact = is_random_checkpoint(model)
    base = is_base(model)
    server_args = [f"--device={args.device}", f"--dtype={args.dtype}", "--max-queue", args.max_queue, *server_args]
    voice = "ryan"
    if base:
        voice_file = saved_voice(model, {"device": args.device, "dtype": args.dtype})
        server_args += ["--voices", voice_file.parent]
        voice = voice_file.stem
    rng = random.Random(args.seed)
    frames = tuple(args.frames)
    actions = plan(args.requests, rng, frames, voice, args.leave_frames)
    report = {"model": str(model), "requests": args.requests, "concurrency": args.concurrency, "frames": frames,
              "server_args": list(map(str, server_args)), "checks": {}}
    with ServerProcess(model, server_args) as server:
        url = server.url
        asyncio.run(warm_up(url, voice, frames, args.concurrency))
        base_health = asyncio.run(now_health(url))
        t0 = time.perf_counter()
        asyncio.run(soak(url, actions, args.concurrency, exact))
        t1 = time.perf_counter()
        report["soak_s"] = t1 - t0
        after = asyncio.run(final_health(url))
        report["idle_after_s"] = time.perf_counter() - t1  # from the last client's end to no row in use
        done = [a for a in actions if a["kind"] in COMPLETE and a["problem"] is None]
        check = done if args.verify == 0 else rng.sample(done, min(args.verify, len(done)))
        t0 = time.perf_counter()
        equal = asyncio.run(replay(url, sorted(check, key=lambda a: a["i"])))
        report["replay_s"] = time.perf_counter() - t0
        end_health = asyncio.run(final_health(url))
        tracebacks = server.tracebacks
    report.update(health_after_warm_up=base_health, health_after_soak=after, health_at_end=end_health)
    kinds = {}
    for a in actions:
        k = kinds.setdefault(a["kind"], {"requests": 0, "problems": 0})
        k["requests"] += 1
        k["problems"] += a["problem"] is not None
    kinds["leave_waiting"] = {**kinds.get("leave_waiting", {"requests": 0, "problems": 0}),
                              "left_before_audio": sum(a["kind"] == "leave_waiting" and a["rec"]["first"] is None
                                                       for a in actions)}
    report["kinds"] = kinds
    report["problems"] = [{"i": a["i"], "kind": a["kind"], "problem": a["problem"]} for a in actions
                          if a["problem"]][:50]
    mem0, mem1 = base_health.get("memory"), after.get("memory")
    report["memory_delta_bytes"] = None if mem0 is None or mem1 is None else mem1 - mem0
    unequal = [i for i, diff, _ in equal if diff is None or diff > args.pcm_tolerance]
    other_codes = [i for i, _, same in equal if same is False]
    report["pcm_differences"] = {"identical": sum(d == 0 for _, d, _ in equal),
                                 "largest": max((d for _, d, _ in equal if d is not None), default=0),
                                 "failed_or_other_length": sum(d is None for _, d, _ in equal)}
    report["codes"] = {"compared": sum(same is not None for *_, same in equal),
                       "identical": sum(same is True for *_, same in equal)}
    c = report["checks"]
    c["every response as expected"] = not report["problems"]
    c["server up, nothing queued or running, no rows"] = (
        after.get("status") == "ok" and (after["queued"], after["running"], after["rows"]) == (0, 0, 0))
    c[f"rows free within {args.idle_within:g} s of the last client"] = report["idle_after_s"] <= args.idle_within
    c["engine counted no failure"] = after["requests"]["failed"] == 0
    c["no traceback in the server log"] = tracebacks == 0
    c["memory back to its level after warm-up"] = (report["memory_delta_bytes"] is None
                                                   or abs(report["memory_delta_bytes"]) <= args.memory_slack_mb << 20)
    c["completed requests have the codes they have alone"] = not other_codes and report["codes"]["compared"] > 0
    c["completed requests equal the same request alone"] = not unequal
    report.update(verified=len(equal), unequal=unequal, other_codes=other_codes, completed=len(done),
                  ok=all(c.values()))
    return report


def table(r: dict) -> str:
    lines = [(f"Soak: {r['requests']} requests, {r['concurrency']} at a time, {r['frames'][0]} to {r['frames'][1]} "
             f"frames each, in {r['soak_s']:.1f} s; {r['completed']} completed, {r['verified']} replayed alone "
             f"in {r['replay_s']:.1f} s."), "", "| kind | requests | problems |", "|---|---|---|"]
    for kind, k in r["kinds"].items():
        extra = f" ({k['left_before_audio']} before any audio)" if "left_before_audio" in k else ""
        lines.append(f"| {kind} | {k['requests']}{extra} | {k['problems']} |")
    h = r["health_after_soak"]
    lines += ["", (f"/health after: queued {h['queued']}, running {h['running']}, rows {h['rows']}, requests "
                  f"{h['requests']}, {r['idle_after_s']:.2f} s after the last client; memory change "
                  f"{r['memory_delta_bytes']} bytes (None: CPU). Replayed alone: codes {r['codes']} (the whole "
                  f"requests), samples {r['pcm_differences']} (largest: the largest sample difference, in steps "
                  "of 16 bits)."), "",
              "| check | result |", "|---|---|"]
    lines += [f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in r["checks"].items()]
    lines += [f"- request {p['i']} ({p['kind']}): {p['problem']}" for p in r["problems"][:10]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    ap.add_argument("--frames", type=int, nargs=2, default=[13, 60], metavar=("MIN", "MAX"),
                    help="frames each request decodes (12.5 a second)")
    ap.add_argument("--leave-frames", type=int, default=0,
                    help="frames of the requests left before any audio (0: like the others); long ones show a "
                         "request that runs on after its client left")
    ap.add_argument("--idle-within", type=float, default=5.0,
                    help="s after the last client by which every row must be free")
    ap.add_argument("--verify", type=int, default=0, help="completed requests replayed alone (0: all)")
    ap.add_argument("--pcm-tolerance", type=int, default=1,
                    help="allowed sample difference from the same request alone, in steps of the last bit")
    ap.add_argument("--memory-slack-mb", type=int, default=0, help="allowed rise of /health memory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-queue", type=int, default=64, help="the server's; above --concurrency, so none is refused")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="soak")
    args, server_args = ap.parse_known_args(argv)
    report = run(args, server_args)
    md = table(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"soak_{args.name}.md").write_text(md)
    write_json(args.out / f"soak_{args.name}.json", report)
    print(md)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
