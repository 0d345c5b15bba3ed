"""Clone parity by reference rate against the official qwen-tts 0.1.1 (tiny random Base checkpoint, CPU fp32,
greedy): references at 8 / 16 / 22.05 / 44.1 / 48 kHz, mono and stereo, int16 and float WAV files.

    .venv/bin/python bench/resample_parity.py --label after

Each run stores its rows under `--label` in bench/results/resample_parity.json and rewrites
bench/results/resample_parity.md with every label stored (so a "before" run of an older resampler stays
beside the "after" run of the current one).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine  # noqa: E402
from engine.checkpoint.writer import ensure_random_checkpoint  # noqa: E402
from tests.support.oracle import import_qwen_tts  # noqa: E402
from tests.support.reference_files import RATES, compare, write_reference  # noqa: E402

RESULTS = ROOT / "bench" / "results"
COLUMNS = ("audio max diff", "x-vector emb. max diff", "ICL emb. max diff", "ref codes equal",
           "x-vector greedy codes equal", "ICL greedy codes equal")


def run() -> list[dict]:
    path = ROOT / ".cache" / "bench" / "random-tiny-base"
    ensure_random_checkpoint(path, "tiny", "base")
    engine = Engine.load(path, device="cpu", dtype="fp32")
    oracle = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(path), device_map="cpu", dtype=torch.float32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for sr in RATES:
            for channels in (1, 2):
                for subtype in ("PCM_16", "FLOAT"):
                    f = write_reference(Path(tmp) / f"ref_{sr}_{channels}ch_{subtype}.wav", sr, channels, subtype)
                    row = compare(engine, oracle, f) | {"subtype": subtype}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    return rows


def summarise(rows: list[dict]) -> dict:
    """Per rate: worst diffs and how many of its files agree (of 4: mono/stereo x int16/float)."""
    out = {}
    for sr in sorted({r["rate"] for r in rows}):
        rs = [r for r in rows if r["rate"] == sr]
        n = len(rs)
        out[sr] = [f"{max(r['audio_max_diff'] for r in rs):.1e}",
                   f"{max(r['xvec_embedding_max_diff'] for r in rs):.1e}",
                   f"{max(r['icl_embedding_max_diff'] for r in rs):.1e}",
                   f"{sum(r['ref_codes_equal'] for r in rs)}/{n}",
                   f"{sum(r['xvec_codes_equal'] for r in rs)}/{n}",
                   f"{sum(r['icl_codes_equal'] for r in rs)}/{n}"]
    return out


def write_markdown(stored: dict) -> str:
    lines = ["# Clone parity by reference rate (tiny random Base checkpoint, CPU fp32, greedy, 8 frames)", "",
             "Each rate: 4 WAV files (mono/stereo x int16/float), 2.5 s of a voiced test signal with harmonics up",
             "to the file's Nyquist. Ours: `engine.audio.load_wav` + `Engine.extract_voice`; official qwen-tts 0.1.1:",
             "`create_voice_clone_prompt(ref_audio=path)` (librosa.load + librosa.resample, soxr HQ). Diffs are the",
             "worst of the 4 files; \"equal\" counts files whose codes are identical. The old filter's largest",
             "audio differences sit at the two ends and in the band just below the file's Nyquist, where the",
             "test signal has energy on purpose; the tiny random speaker encoder magnifies them. Reproduce with",
             "`python bench/resample_parity.py --label after`.", ""]
    for label, rows in stored.items():
        lines += [f"## {label}", "", "| reference rate | " + " | ".join(COLUMNS) + " |",
                  "|---" * (len(COLUMNS) + 1) + "|"]
        for sr, cells in summarise(rows).items():
            lines.append(f"| {sr / 1000:g} kHz | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help='e.g. "before: Kaiser polyphase filter" or "after: soxr HQ"')
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = run()
    store = RESULTS / "resample_parity.json"
    stored = json.loads(store.read_text()) if store.is_file() else {}
    stored[args.label] = rows
    store.write_text(json.dumps(stored, indent=1) + "\n")
    md = write_markdown(stored)
    (RESULTS / "resample_parity.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
