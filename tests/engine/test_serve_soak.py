"""The serving soak (bench/serve_soak.py) on CPU with a tiny checkpoint: requests in a row against one server
process, with clients that leave mid-stream or before their audio starts and bad requests mixed in, several at a
time on fewer rows than requests. Afterwards the server holds nothing, counted no failure, named the field of
every bad request, and every completed request equals the same request served alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "bench" / "serve_soak.py"


def run_soak(model: Path, out: Path, *args) -> tuple[subprocess.CompletedProcess, dict]:
    # one torch thread in each process (the server inherits it): tiny models are overhead-bound, cores are shared
    proc = subprocess.run([sys.executable, str(SOAK), "--model", str(model), "--device", "cpu", "--dtype", "fp32",
                           "--out", str(out), "--name", "test", *map(str, args)], check=False,
                          capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = json.loads((out / "soak_test.json").read_text()) if (out / "soak_test.json").is_file() else {}
    return proc, report


def test_soak_leaves_nothing_behind_and_every_request_equals_it_alone(tiny_checkpoints, tmp_path, figure):
    proc, r = run_soak(tiny_checkpoints["custom_voice"], tmp_path, "--requests", 160, "--concurrency", 6,
                       "--frames", 3, 12, "--max-rows", 4, "--seed", 1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert r["ok"] and all(r["checks"].values()), r["checks"]
    assert r["problems"] == []
    kinds = r["kinds"]
    assert set(kinds) == {"stream", "whole", "leave_mid_stream", "leave_waiting", "bad"}
    assert sum(k["requests"] for k in kinds.values()) == 160 and all(k["requests"] > 0 for k in kinds.values())
    after = r["health_after_soak"]
    assert after["status"] == "ok" and (after["queued"], after["running"], after["rows"]) == (0, 0, 0)
    assert after["requests"]["failed"] == 0 and after["requests"]["cancelled"] > 0
    assert after["memory"] is None and r["memory_delta_bytes"] is None  # CPU: torch counts no tensors
    # every completed request replayed alone: same length, samples within one step of the last bit
    assert r["verified"] == r["completed"] == kinds["stream"]["requests"] + kinds["whole"]["requests"] > 0
    assert r["unequal"] == [] and r["pcm_differences"]["failed_or_other_length"] == 0
    assert r["pcm_differences"]["largest"] <= 1
    # the whole requests brought their codes: each the same codes as alone
    assert r["codes"]["compared"] == r["codes"]["identical"] == kinds["whole"]["requests"] and r["other_codes"] == []
    assert "| completed requests have the codes they have alone | pass |" in proc.stdout
    assert "| completed requests equal the same request alone | pass |" in proc.stdout
    figure(soak_requests=160, completed=r["completed"], bad=kinds["bad"]["requests"],
           left_mid_stream=kinds["leave_mid_stream"]["requests"], left_waiting=kinds["leave_waiting"]["requests"],
           soak_s=round(r["soak_s"], 1), replay_s=round(r["replay_s"], 1), identical=r["pcm_differences"]["identical"])


def test_soak_of_a_base_checkpoint_with_a_saved_voice(tiny_checkpoints, tmp_path):
    """A Base checkpoint clones in context from a voice the soak extracts once and serves from --voices."""
    proc, r = run_soak(tiny_checkpoints["base"], tmp_path, "--requests", 40, "--concurrency", 4, "--frames", 3, 8,
                       "--max-rows", 2, "--max-takes", 1, "--seed", 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert r["ok"] and r["verified"] == r["completed"] > 0
    assert "--voices" in r["server_args"]


def test_a_failed_check_fails_the_soak(tiny_checkpoints, tmp_path):
    """The soak's verdict follows its checks: replaying with a negative tolerance finds every request unequal."""
    proc, r = run_soak(tiny_checkpoints["custom_voice"], tmp_path, "--requests", 12, "--concurrency", 2,
                       "--frames", 3, 4, "--max-rows", 2, "--max-takes", 1, "--pcm-tolerance", -1)
    assert proc.returncode == 1
    assert not r["ok"] and r["checks"]["completed requests equal the same request alone"] is False
    assert len(r["unequal"]) == r["verified"] > 0
    assert "| completed requests equal the same request alone | FAIL |" in proc.stdout
