"""The persistent code-predictor pass against the per-layer kernels, in one process on one GPU.

    python bench/predictor_pass_bench.py --out DIR [--size 0.6b] [--takes 1 16] [--frames 200]

Loads a real-size random CustomVoice checkpoint (built like bench/gpu_bench.py) with the Triton kernels
and the opt-in predictor_pass kernel, then
  * fp32: greedy codes of the graphed engine (persistent pass) against the plain eager runner over
    --frames frames (must be identical);
  * bf16, for each row count: the whole-frame graph replayed 200 times with the predictor pass per-layer
    (what main runs) and persistent, recapturing between them; kernels per frame (profiled eager frame
    body) and weight bandwidth (weight bytes one frame reads / frame time).
Writes DIR/predictor_pass_<size>.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def weight_bytes_per_frame(talker) -> int:
    """Bytes of weights one frame reads on the per-layer path: every talker layer and the codec head once,
    the predictor layers 16 times (positions 0..15), 15 codebook heads, the projection 16 times."""
    def size(module):
        return sum(p.numel() * p.element_size() for p in module.parameters())

    pred = talker.code_predictor
    return (size(talker.model.layers) + size(talker.codec_head) + 16 * size(pred.model.layers)
            + size(pred.lm_head) + 16 * size(pred.small_to_mtp_projection))


def fp32_parity(ckpt, frames: int, takes: int) -> dict:
    from engine import Engine, Request
    from engine.decode import EagerFrames
    from tests.support.decoding import decode_codes

    torch.backends.cuda.matmul.allow_tf32 = False
    eng = Engine.load(ckpt, device="cuda", dtype="fp32", cuda_graphs="on", triton="on", max_seq_len=1024)
    req = Request(mode="custom", text="The persistent pass must decode exactly the eager codes, frame by frame.",
                  language="English", speaker="ryan")
    params = eng.defaults.greedy().replace(max_new_tokens=frames)
    t = time.perf_counter()
    graphed, _ = decode_codes(eng, eng.runner, req, takes, params)
    persistent = bool(eng.runner.fused["predictor"].persistent)
    plain, _ = decode_codes(eng, EagerFrames(eng.talker), req, takes, params)
    same = graphed.shape == plain.shape and torch.equal(graphed.cpu(), plain.cpu())
    frames_equal = int((graphed.cpu() == plain.cpu()).all(-1).all(0).sum()) if graphed.shape == plain.shape else 0
    out = {"takes": takes, "frames": int(graphed.shape[1]), "identical": same, "frames_equal": frames_equal,
           "persistent_ran": persistent, "kernels": eng.info.kernels, "seconds": round(time.perf_counter() - t, 1)}
    del eng
    torch.cuda.empty_cache()
    return out


VARIANTS = (("per-layer (main)", None), ("persistent (8 warps, L2 prefetch)", {}),
            ("persistent, no L2 prefetch", {"prefetch": False}), ("per-layer again", None))


_ENGINES: dict = {}


def speed(ckpt, takes_list, size) -> list:
    from gpu_bench import TEXT
    from profile_frame import recaptured_frame

    from engine import Engine, Request
    from engine.kernels.predictor_pass import PredictorPass

    if "bf16" not in _ENGINES:  # one engine for every row count
        _ENGINES["bf16"] = Engine.load(ckpt, device="cuda", dtype="bf16", cuda_graphs="on", triton="on",
                                       max_seq_len=1024)
    eng = _ENGINES["bf16"]
    fs = eng.runner.fused["predictor"]
    wbytes = weight_bytes_per_frame(eng.talker)
    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    rows = []
    for takes in takes_list:
        eng.generate(req, takes=takes, seed=0, params=eng.defaults.replace(max_new_tokens=64))
        for name, launch in VARIANTS:
            fs.persistent = False if launch is None else PredictorPass(fs, max_rows=16, **launch)
            ms, count = recaptured_frame(eng)
            grid = sorted(set(fs.persistent.grids.values())) if fs.persistent else None
            row = {"size": size, "takes": takes, "variant": name, "ms_per_frame": round(ms, 3),
                   "kernels_per_frame": count, "weight_GB_per_frame": round(wbytes / 1e9, 3),
                   "TBps": round(wbytes / (ms * 1e-3) / 1e12, 3), "grid": grid}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="0.6b")
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--skip-parity", action="store_true")
    args = ap.parse_args()
    from engine.kernels import PERSISTENT_PREDICTOR_ENV, selftest

    os.environ[PERSISTENT_PREDICTOR_ENV] = "1"
    import triton
    from gpu_bench import checkpoint

    ckpt = checkpoint(args.size)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "size": args.size}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():  # after every step: a run cut short keeps what it measured
        (out / f"predictor_pass_{args.size}.json").write_text(json.dumps(result, indent=1))

    real = {"hidden": 1024, "inter": 3072, "layers": 5, "nh": 16, "nkv": 8, "d": 128}
    result["speed"], result["bf16_logits_cosine"] = [], {}
    for takes in args.takes:
        result["speed"] += speed(ckpt, [takes], args.size)
        save()
        try:
            result["bf16_logits_cosine"][takes] = selftest.check_predictor_pass(
                "cuda", torch.bfloat16, takes, positions=16, vocab=2048, **real)
        except AssertionError as exc:
            result["bf16_logits_cosine"][takes] = f"failed: {exc}"
        print("bf16 logits cosine (real predictor size, 16 positions):", result["bf16_logits_cosine"], flush=True)
        save()
    if not args.skip_parity:
        _ENGINES.clear()
        torch.cuda.empty_cache()
        result["fp32_parity"] = fp32_parity(ckpt, args.frames, 1)
        print(json.dumps(result["fp32_parity"]), flush=True)
        save()


if __name__ == "__main__":
    main()
