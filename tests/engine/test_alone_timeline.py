"""The lone-request timeline bench (bench/alone_timeline.py), run small on the CPU with a tiny checkpoint: both paths
are timed, each step the table names began before the first audio and took no longer than it, and the scheduler's
chunk reaches the caller after the loop put it."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_lone_requests_timeline(tiny_checkpoints, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "alone_timeline.py"), "--model",
                           str(tiny_checkpoints["custom_voice"]), "--device", "cpu", "--dtype", "fp32", "--requests", "2",
                           "--out", str(tmp_path), "--name", "test"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with gzip.open(tmp_path / "alone_timeline_test.json.gz") as f:
        data = json.load(f)
    assert data["table"] in proc.stdout
    assert [len(data["records"][p]) for p in ("stream", "scheduler")] == [2, 2]
    for path, steps in (("stream", ("prepare", "session", "open", "admit", "start", "next_frame", "push")),
                        ("scheduler", ("prepare", "session", "open", "admit", "start", "next_frame", "push", "put"))):
        for record in data["records"][path]:
            assert set(record["steps"]) == set(steps), (path, record["steps"])
            for step in record["steps"].values():
                assert 0 <= step["at_ms"] and 0 < step["ms"] <= record["first_ms"] and step["n"] >= 1
    for record in data["records"]["scheduler"]:
        assert 0 < record["admitted_ms"] <= record["put_ms"] < record["first_ms"] and record["to_caller_ms"] > 0
