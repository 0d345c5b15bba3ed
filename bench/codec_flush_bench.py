"""Frames per side-stream codec piece while a request runs (engine/gpu/codec_overlap.FLUSH_FRAMES): an A/B
of whole requests in one process.

    python bench/codec_flush_bench.py [--size 0.6b] [--flush 16 32] [--takes 1 4 16] [--rounds 2] [--out F.json]

--flush 0: no piece while the frames run (the codec decodes after the last frame), to tell the overlap's share
of the request-to-request spread.

At one take the codec's pieces cost about the same beside the frames as after them (bench/loop_overhead.py:
generate 2.959 against no_overlap 2.972 ms a frame), so a piece's fixed cost is paid per piece: a one-row piece
of 16 frames replays in 1.594 ms, one of 32 in 1.870 (bench/results/codec_fused_h100.md). Larger pieces pay it
less often; the last, padded piece after the last frame may be larger. This times what a user sees: the wall of
whole requests at the real-length script's kind of lengths (1 take and 4 takes), and of the 250-frame bench's
request (16 takes), each flush size in turn, interleaved, medians of 3.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_probe import NO_FLUSH, load_captured, request_wall_s  # noqa: E402

LENGTHS = {1: (13, 37, 64, 100, 142, 213, 269, 356), 4: (13, 37, 64, 100, 142, 213, 269, 356), 16: (250,)}


def walls_ms(eng, takes: int, lengths) -> tuple[float, list]:
    """Summed wall of one request per length (median of 3 each), ms, and every request's three walls."""
    each = [[round(1000 * request_wall_s(eng, takes, n), 2) for _ in range(3)] for n in lengths]
    return sum(statistics.median(w) for w in each), each


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--flush", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from engine.gpu import codec_overlap

    eng = load_captured(args.size, tuple(args.takes))
    rows = []

    def save():  # after every row: a run cut short keeps what it measured
        if args.out:
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "size": args.size, "rows": rows},
                                           indent=1))

    for takes in args.takes:
        lengths = LENGTHS[takes]
        walls_ms(eng, takes, lengths)  # warm: every padded tail piece replayed once
        for rnd in range(args.rounds):
            for flush in args.flush:
                codec_overlap.FLUSH_FRAMES = flush or NO_FLUSH
                ms, each = walls_ms(eng, takes, lengths)
                rows.append({"takes": takes, "flush": flush, "round": rnd, "frames": sum(lengths),
                             "wall_ms": round(ms, 2), "ms_per_frame": round(ms / sum(lengths), 4)})
                print(json.dumps(rows[-1]), flush=True)
                rows[-1]["walls_ms"] = each
                save()


if __name__ == "__main__":
    main()
