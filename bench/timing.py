"""Shared by the benches: the best of several timed runs, percentiles, GPU time of a call, the kernels of a call,
the GPU's short name for result files, a worker run in a fresh process, the options of a tree A/B bench, the
writing of a result file."""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time


def _rounded(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def write_json(path, data) -> None:
    """A result file: floats to 6 significant digits (a microsecond of a second is below any figure we report)
    and no indentation, so results stay small in a clone; the .md beside it is the readable table. A path
    ending in .gz is gzip-compressed (the per-request and per-kernel records; read with zcat or gzip.open)."""
    import gzip
    from pathlib import Path

    text = (json.dumps(_rounded(data), separators=(",", ":")) + "\n").encode()
    path = Path(path)
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


def best_of(run, n: int = 3, key=None):
    """Call run(rep) for rep in 0..n-1 and return the result that is smallest by `key` (the first on ties)."""
    return min((run(rep) for rep in range(n)), key=key)


def percentile(xs, q):
    """The q-th percentile of xs: the sorted value at the nearest rank (no interpolation)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def mean_gpu_ms(fn, repeats: int = 20, warm: bool = True) -> float:
    """Mean GPU milliseconds of fn() called back to back `repeats` times (one warm call first unless warm is
    False; CUDA events around the run, so host launch time between calls counts only where the GPU waits for it)."""
    import torch

    if warm:
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(repeats):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / repeats


def cuda_kernels(fn, width: int = 90) -> list:
    """The CUDA kernels of one fn() call (after one warm call), grouped by name cut to `width` characters:
    [{kernel, count, us}], by summed device time. A graph replays exactly the kernels of its eager body."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    groups = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            g = groups.setdefault(e.name[:width], [0, 0.0])
            g[0] += 1
            g[1] += e.device_time_total
    rows = [{"kernel": k, "count": c, "us": round(us, 1)} for k, (c, us) in groups.items()]
    return sorted(rows, key=lambda r: -r["us"])


def gpu_tag() -> str:
    """"h100", "h200" or "gpu": the suffix of a bench's result files."""
    import torch

    name = torch.cuda.get_device_name(0)
    return "h100" if "H100" in name else "h200" if "H200" in name else "gpu"


def run_fresh(script, args, timeout=None, env=None) -> dict:
    """`python script *args` in a fresh process (every shape and library seen for the first time), whose
    last stdout line is a JSON object: that object, or {"error": the last stderr line} if the process failed.
    The tail of its stderr is echoed either way. env: variables set for that process beside this one's."""
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env={**os.environ, **env} if env else None)
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


class GcPauses:
    """Python's garbage collections while the `with` block runs (gc.callbacks): `during(t0, t1)` gives how many
    started between two perf_counter times, their summed and longest pause and the oldest generation collected.
    A collection stops every Python thread, the decode loop's included, while the GPU drains its queue."""

    def __init__(self):
        self.events: list[tuple[float, float, int]] = []  # (perf_counter at start, seconds, generation)
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start = now
        else:
            self.events.append((self._start, now - self._start, info["generation"]))

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)
        return False

    def during(self, t0: float, t1: float) -> dict:
        got = [e for e in self.events if t0 <= e[0] <= t1]
        if not got:
            return {"collections": 0}
        return {"collections": len(got), "ms": round(1000 * sum(e[1] for e in got), 3),
                "longest_ms": round(1000 * max(e[1] for e in got), 3), "oldest_generation": max(e[2] for e in got)}


class GpuClocks:
    """The GPU's SM clock, power draw and temperature, sampled by one `nvidia-smi -lms` process on a thread
    while the `with` block runs; `during(t0, t1)` sums up the samples between two perf_counter times. Without
    nvidia-smi, or with enabled=False (an A/B against the sampler itself), it records nothing and `during`
    returns {}."""

    QUERY = "clocks.sm,power.draw,temperature.gpu"

    def __init__(self, period_ms: int = 100, gpu: int = 0, enabled: bool = True):
        self.period_ms, self.gpu, self.enabled = period_ms, gpu, enabled
        self.samples: list[tuple[float, float, float, float]] = []  # (perf_counter, MHz, W, C)
        self.proc = None

    def __enter__(self):
        if not self.enabled or shutil.which("nvidia-smi") is None:
            return self
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits",
                                      f"-lms={self.period_ms}", f"-i={self.gpu}"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)

        def read():
            for line in self.proc.stdout:
                try:
                    mhz, watts, temp = (float(v) for v in line.split(","))
                except ValueError:
                    continue  # "[N/A]" fields
                self.samples.append((time.perf_counter(), mhz, watts, temp))

        threading.Thread(target=read, name="gpu-clocks", daemon=True).start()
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
        return False

    def during(self, t0: float, t1: float) -> dict:
        got = [s for s in self.samples if t0 <= s[0] <= t1]
        if not got:
            return {}
        mhz = [s[1] for s in got]
        return {"sm_mhz_mean": round(sum(mhz) / len(mhz), 1), "sm_mhz_min": min(mhz), "sm_mhz_max": max(mhz),
                "power_w_mean": round(sum(s[2] for s in got) / len(got), 1), "temp_c_max": max(s[3] for s in got),
                "clock_samples": len(got)}


def tree_ab_parser() -> argparse.ArgumentParser:
    """Options shared by the benches that load engine trees side by side, each in fresh worker processes:
    --roots LABEL=DIR ... (the parent), --worker --root DIR --ckpt DIR (a worker), --size, --out, --name.
    A bench adds its own options, then calls tree_ab_args."""
    from pathlib import Path

    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--root", type=Path)
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--roots", nargs="+", default=[], help="LABEL=DIR: import `engine` from DIR")
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--name", default="")
    return ap


def tree_ab_args(ap: argparse.ArgumentParser, worker) -> tuple:
    """Parse a tree_ab_parser's options. In a worker process: print worker(root, ckpt) as JSON and exit. In the
    parent: (args, {label: tree dir})."""
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.root, args.ckpt)))
        raise SystemExit(0)
    return args, dict(r.split("=", 1) for r in args.roots)


def run_tree(script, label: str, root: str, ckpt, env=None) -> dict:
    """One worker of a tree A/B bench (`script --worker`) in a fresh process: its JSON, or exit naming the tree.
    env: variables set for that worker only (run_fresh)."""
    r = run_fresh(script, ["--worker", "--root", root, "--ckpt", str(ckpt)], env=env)
    if "error" in r:
        raise SystemExit(f"{label}: {r['error']}")
    return r
