"""The serving bench (bench/serve_bench.py), run small on CPU with tiny checkpoints: two low arrival rates, a
short saturation run and requests alone against the engine in-process; its table and JSON are written and the
figures hold together (every request succeeded with all its frames, first audio after the send, the audio
counted equals the frames asked for)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "serve_bench.py"
FPS = 12.5


def run_bench(model: Path, out: Path, *args) -> tuple[dict, str, list]:
    proc = subprocess.run([sys.executable, str(BENCH), "--model", str(model), "--device", "cpu", "--dtype", "fp32",
                           "--out", str(out), "--name", "test", *map(str, args)], check=False,
                          capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    md = (out / "serve_test.md").read_text()
    assert md in proc.stdout  # the table is printed too
    records = json.loads(gzip.decompress((out / "serve_test_requests.json.gz").read_bytes()))
    return json.loads((out / "serve_test.json").read_text()), md, records


def _check_rate(r: dict, records: list) -> None:
    assert r["requests"] > 0 and r["succeeded"] == r["requests"] and r["success_rate"] == 1.0
    assert r["rejected_503"] == 0 and r["failed_other"] == 0
    assert 0 < r["first_audio_p50_ms"] <= r["first_audio_p95_ms"] < 60_000
    assert r["gap_p95_ms"] is None or r["gap_p95_ms"] >= 0
    assert r["underrun_requests"] <= min(r["requests"], r["underrun_events"])
    # random weights, EOS off: every request brought exactly its frames, and the throughput counts them all
    assert all(q["bytes"] == q["frames"] * 3840 and q["done"] for q in records)
    assert abs(r["audio_s"] - sum(q["frames"] for q in records) / FPS) < 1e-6
    # over the window from the first send to the last byte (record times count from the first send)
    assert abs(r["window_s"] - max(q["chunks"][-1][0] for q in records)) < 1e-4
    assert abs(r["audio_s_per_s"] / (r["audio_s"] / r["window_s"]) - 1) < 1e-4 and r["audio_s_per_s"] > 0
    first = [q["first"] - q["sent"] for q in records]
    assert all(0 < f <= q["chunks"][0][0] - q["sent"] for f, q in zip(first, records))
    h = r["health_after"]
    assert h["status"] == "ok" and h["queued"] == 0 and h["requests"]["failed"] == 0


def test_bench_of_a_custom_voice_checkpoint(tiny_checkpoints, tmp_path, figure):
    results, md, records = run_bench(tiny_checkpoints["custom_voice"], tmp_path, "--rates", 2, 4, "--duration", 1.5,
                                     "--saturation", 3, "--saturation-s", 1.5, "--alone", 2, "--max-rows", 4)
    (c,) = results["configs"]
    assert [r["rate"] for r in c["rates"]] == [2, 4]
    # what ran, as the server said it at startup: the table names the device, graphs and kernels
    assert c["serving"].startswith("serving ") and "on cpu" in c["serving"] and "CUDA graphs off" in c["serving"]
    assert f"Served: {c['serving']}." in md
    for r, rec in zip(c["rates"], records):
        assert rec["phase"] == f"rate {float(r['rate'])}"
        _check_rate(r, rec["requests"])
    s = c["saturation"]
    assert s["streams"] == 3 and s["audio_s_per_s"] > 0 and s["requests_finished"] > 0 and s["success_rate"] == 1.0
    assert s["health_after"]["running"] == 0 and s["health_after"]["rows"] == 0  # the cut streams were freed
    # the server's event loop while saturated: busy for part of the window, some CPU for every chunk it sent
    assert s["chunks"] > 0 and 0 < s["loop_busy"] < 1.5 and s["loop_ms_per_chunk"] > 0
    assert "| loop CPU ms per chunk |" in md
    assert list(c["alone_server"]) == ["new", "kept"] and len(c["alone_inprocess_ms"]) == 2
    for got in c["alone_server"].values():
        assert len(got["first_ms"]) == 2 and min(got["first_ms"] + c["alone_inprocess_ms"]) > 0
        # each alone request's Server-Timing: the server's steps, within the first audio the client saw
        for first, steps in zip(got["first_ms"], got["steps_ms"]):
            assert list(steps) == ["parse", "submit", "audio"] and 0 < sum(steps.values()) < first
    assert "parse / submit / audio p50 | outside p50 |" in md and "| kept | 2 |" in md
    assert "--max-rows" in c["server_args"] and "4" in c["server_args"]  # passed through to the server
    assert f"| {tiny_checkpoints['custom_voice'].name} |" in md and "3 streams" in md and "not measured here" in md
    assert "111.9" in md and "32.8" in md
    figure(rate2_first_audio_p50_ms=round(c["rates"][0]["first_audio_p50_ms"], 1),
           saturation_audio_s_per_s=round(s["audio_s_per_s"], 2),
           alone_overhead_ms=round(c["alone_server"]["new"]["first_ms"][0] - c["alone_inprocess_ms"][0], 1))


def test_bench_of_a_base_checkpoint_with_a_saved_and_an_uploaded_voice(tiny_checkpoints, tmp_path):
    model = tiny_checkpoints["base"]
    results, md, records = run_bench(model, tmp_path, "--rates", 3, "--duration", 1.0, "--saturation", 0,
                                     "--alone", 1, "--max-rows", 2, "--max-takes", 1)
    (c,) = results["configs"]
    assert c["label"].endswith("ICL saved") and "--voices" in c["server_args"] and "ICL saved |" in md
    assert (model.parent / f"{model.name}-voices" / "bench_reference.safetensors").is_file()
    _check_rate(c["rates"][0], records[0]["requests"])
    assert "saturation" not in c and len(c["alone_inprocess_ms"]) == 1
    results, _, records = run_bench(model, tmp_path, "--rates", 3, "--duration", 1.0, "--saturation", 0,
                                     "--alone", 1, "--max-rows", 2, "--max-takes", 1, "--clone", "upload")
    (c,) = results["configs"]
    assert c["label"].endswith("ICL upload") and "--voices" not in c["server_args"]
    _check_rate(c["rates"][0], records[0]["requests"])


def test_underruns_count_chunks_that_come_after_the_audio_before_them_has_played():
    sys.path.insert(0, str(ROOT / "bench"))
    from serve_client import underruns

    second = 48_000  # bytes of one second of audio
    assert underruns([]) == 0 and underruns([[0.0, second]]) == 0
    assert underruns([[0.0, second], [0.9, second], [1.9, second]]) == 0  # each in time
    assert underruns([[0.0, second], [1.2, second]]) == 1  # the first second ran out at 1.0
    # playback resumes at the late chunk: the next is measured from there (1.2 + 1 s), not from the first
    assert underruns([[0.0, second], [1.2, second], [2.1, second]]) == 1
    assert underruns([[0.0, second // 10], [0.2, second // 10], [0.4, second // 10]]) == 2
