"""Which device allocations outlive Engine.release(): load / run / release cycles with allocation stacks.

    python bench/release_trace.py [--cycles 2] [--max-seq-len 512]

A tiny random CustomVoice checkpoint is loaded as the GPU release test loads it (graphs and Triton on), runs a
batch and a stream, and is released. After each cycle the blocks still allocated are listed with the engine
frames that made them (torch's memory history). An empty list is the release test's contract. Needs CUDA."""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Engine, Request  # noqa: E402
from engine.checkpoint.writer import write_random_checkpoint  # noqa: E402

OURS = ("/engine/", "/tests/", "/bench/")


def live_blocks() -> list[tuple[int, int, list[str]]]:
    """(stream, bytes, the allocating frames of ours) of every block still allocated."""
    out = []
    for seg in torch.cuda.memory._snapshot()["segments"]:
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                frames = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in block.get("frames", [])
                          if any(part in f["filename"] for part in OURS)]
                out.append((seg["stream"], block["size"], frames))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=512)
    args = ap.parse_args()
    path = write_random_checkpoint(Path(tempfile.mkdtemp()) / "cv", "tiny", "custom_voice", seed=0)
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    req = Request(mode="custom", text="Load, capture, release.", language="English", speaker="ryan")
    for cycle in range(args.cycles):
        eng = Engine.load(path, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", max_takes=3,
                          max_seq_len=args.max_seq_len)
        params = eng.defaults.replace(max_new_tokens=6)
        eng.generate(req, takes=1 + cycle % 3, seed=cycle, params=params)
        for _ in eng.stream(req, seed=cycle, params=params, chunk_frames=2):
            pass
        eng.release()
        gc.collect()
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        blocks = live_blocks()
        print(f"== cycle {cycle}: allocated {torch.cuda.memory_allocated()} B, reserved "
              f"{torch.cuda.memory_reserved()} B, {len(blocks)} blocks live")
        for stream, size, frames in blocks:
            print(f"-- stream {stream}, {size} B")
            for frame in frames[:8] or ["(no frame of ours)"]:
                print(f"     {frame}")
        del eng


if __name__ == "__main__":
    main()
