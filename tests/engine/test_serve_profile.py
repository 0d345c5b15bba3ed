"""The scheduler's profile bench (bench/serve_profile.py), run small on CPU with a tiny checkpoint: both saturated
windows and a window of arrivals are measured, audio arrives, the timed phases are the loop's own (every window
stepped frames and ran the codec, and the phases never take more than the wall time), and each arrival's first
audio is the sum of its parts. A Base checkpoint's requests clone the benches' saved voice."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model_type", ["custom_voice", "base"])
def test_profile_of_a_saturated_scheduler(tiny_checkpoints, tmp_path, model_type):
    model = tmp_path / model_type  # a copy: the Base run saves the benches' voice beside its checkpoint
    shutil.copytree(tiny_checkpoints[model_type], model)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "serve_profile.py"), "--model", str(model), "--device", "cpu", "--dtype", "fp32", "--rows", "2",
                           "--streams", "3", "--rates", "4", "--warm-s", "0.5", "--seconds", "1", "--out", str(tmp_path), "--name",
                           "test"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "serve_profile_test.json").read_text())
    assert data["table"] in proc.stdout
    (run,) = data["configs"]
    assert run["mode"] == ("clone" if model_type == "base" else "custom")
    for window in ("free", "synced"):
        w = run[window]
        assert w["audio_s_per_s"] > 0 and w["steps_per_s"] > 0
        assert w["phases"]["frames"]["calls"] > 0 and w["phases"]["codec"]["calls"] > 0
        assert 0 < sum(p["ms_per_s"] for p in w["phases"].values()) <= 1000 * 1.05
    (rate,) = run["rates"]
    assert rate["rate"] == 4 and rate["requests"] > 0 and rate["steps_per_s"] > 0
    assert rate["phases"]["admit"]["calls"] > 0 and rate["phases"]["codec"]["calls"] > 0
    assert 0 < rate["join"]["p50_ms"] <= rate["first"]["p50_ms"]
    assert rate["prepare"]["p50_ms"] > 0
