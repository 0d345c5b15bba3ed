"""The codec's SnakeBeta sine and the fused residual-unit tail (engine/kernels/snake_conv1x1.py), A/B in one process.

    python bench/codec_fused_bench.py [--out FILE.json] [--sweep]

Builds the real-size codec decoder with random weights (bench/codec_piece_bench.py's), bf16 on CUDA, and for
each variant captures the piece graphs for 1 and 16 rows as Engine.load does and replays them (GPU ms a piece):
  * accurate_sin: SnakeBeta alone as Triton, libdevice sinf (the previous main's kernels);
  * fast_sin: SnakeBeta alone, the reduced argument's hardware sine for bf16;
  * fused: fast_sin, and each residual unit's SnakeBeta, 1x1 conv and residual add as one launch.
It also profiles one eager 16-row, 16-frame piece per variant (kernels and summed GPU us) and compares a 45-frame
decode through the pieces with a float32 one-pass decode of the same weights (max abs difference; bf16 noise).
--sweep times snake_conv1x1 alone for a few tile shapes against the three launches it replaces, at each
residual unit's width for 1-row and 16-row pieces, and the SnakeBeta launch alone for tile sizes and warps.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codec_piece_bench import build_decoder, kernel_table
from kernel_bench import graph_time_us
from timing import mean_gpu_ms

# name: (kernels, FAST_SIN_DTYPES or None to keep it). (Also tried: the undilated k = 7 convs folded as (7, 1)
# convs like the dilated ones: 16x16 6.34 -> 6.78 ms, cuDNN picked slower kernels at 96 and 192 channels.)
VARIANTS = {"accurate_sin": (["snake"], ()), "fast_sin": (["snake"], None), "fused": (["snake", "snake_conv1x1"], None)}


@contextlib.contextmanager
def fast_sine_for(dtypes):
    """snake.FAST_SIN_DTYPES set to `dtypes` inside the block (None: left as it is)."""
    from engine.kernels import snake

    saved = snake.FAST_SIN_DTYPES
    snake.FAST_SIN_DTYPES = saved if dtypes is None else dtypes
    try:
        yield
    finally:
        snake.FAST_SIN_DTYPES = saved


def run_variant(dec, names, fast_dtypes, ref, codes45, repeats) -> dict:
    from engine import kernels
    from engine.gpu.codec_graph import CodecGraphs

    with fast_sine_for(fast_dtypes):
        dec.use_kernels(kernels.Kernels(names))
        try:
            graphs = CodecGraphs(dec)
            graphs.precapture([1, 16])
            torch.cuda.synchronize()
            out = {"replay_ms": {}}
            for bucket, size in ((1, 1), (1, 16), (1, 32), (16, 1), (16, 16), (16, 32)):
                graph = graphs.graphs[(bucket, size)][0]
                out["replay_ms"][f"{bucket}x{size}"] = round(mean_gpu_ms(graph.replay, repeats), 4)
            state = graphs.state(16)
            codes = torch.zeros(16, dec.cfg.num_quantizers, 16, dtype=torch.long, device="cuda")
            table = kernel_table(lambda: dec(codes, state, check=False))
            out["profile_16x16"] = {k: table[k] for k in ("kernels", "summed_us", "top", "ops_by_shape")}
            got = []
            for row in range(codes45.shape[0]):
                graphs.state(1).zero_()
                got.append(graphs.decode(codes45[row: row + 1], graphs.state(1), final=True).float())
            graphs.state(16).zero_()
            got16 = graphs.decode(codes45, graphs.state(16), final=True).float()
            out["vs_fp32_one_pass_max_abs"] = {"bucket1": (torch.cat(got) - ref).abs().max().item(),
                                               "bucket16": (got16 - ref).abs().max().item()}
            out["audio"] = got16.cpu()
            out["eager_audio"] = dec(codes45, check=False).float().cpu()  # one pass, no graphs
            return out
        finally:
            dec.use_kernels(None)


# (channels, samples a frame) of the four wave blocks' residual units
WIDTHS = [(768, 32), (384, 160), (192, 640), (96, 1920)]
TILES = [(16, 32, 128, 4, 2), (16, 64, 128, 4, 2), (32, 32, 128, 4, 2), (32, 32, 256, 4, 1), (32, 32, 256, 4, 2),
         (32, 64, 128, 4, 2), (64, 32, 128, 4, 2), (64, 32, 256, 8, 2), (64, 64, 256, 8, 2), (128, 32, 256, 8, 1),
         (128, 32, 256, 8, 2), (128, 32, 128, 8, 2), (64, 32, 64, 4, 2), (32, 32, 64, 4, 2), (16, 32, 64, 2, 2),
         (128, 64, 256, 8, 3),
         # one column block over the whole 384 / 768 output width (the activation computed once a row block); not
         # timed yet; ptxas of Triton 3.6: 102 / 157 / 215 registers, no spill
         (16, 32, 512, 8, 1), (16, 32, 1024, 8, 1), (32, 32, 1024, 8, 1)]


def sweep(repeats) -> dict:
    """snake_conv1x1 alone (GPU us a launch, in a CUDA graph of 20) for a few tile shapes, against the three
    launches it replaces (the Triton SnakeBeta, F.linear, the residual add), at each residual unit's width for a
    1-row 1-frame piece, a 1-row 16-frame piece and a 16-row 16-frame piece."""
    import torch.nn.functional as F

    from engine.kernels import snake
    from engine.kernels import snake_conv1x1 as k

    g = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for c, per_frame in WIDTHS:
        for b, frames in ((1, 1), (1, 16), (16, 16)):
            length = per_frame * frames
            h = torch.randn(b, length, c, device="cuda", generator=g).bfloat16()
            x = torch.randn(b, length, c, device="cuda", generator=g).bfloat16()
            vec = [torch.rand(c, device="cuda", generator=g).bfloat16() + 0.5 for _ in range(4)]
            w = (torch.randn(c, c, device="cuda", generator=g) * c ** -0.5).bfloat16()
            args = (h, vec[0], vec[1], vec[2], w, vec[3], x)
            want = k.reference(*args)

            def three(): return x + F.linear(snake.snake(h, vec[0], vec[1], vec[2]), w, vec[3])
            row = {"three_launches_us": round(graph_time_us(three, inner=20, reps=repeats), 2)}
            for bm, bk, bn, warps, stages in TILES:
                cfg = {"BLOCK_M": bm, "BLOCK_K": bk, "MAX_BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
                key = f"m{bm}_k{bk}_n{bn}_w{warps}_s{stages}"
                try:
                    got = k.snake_conv1x1(*args, config=cfg)
                    row[key] = round(graph_time_us(lambda cfg=cfg: k.snake_conv1x1(*args, config=cfg), 20, repeats), 2)
                    row[key + "_err"] = (got.float() - want.float()).abs().max().item()
                except Exception as exc:  # a tile shape that does not compile or fit: reported, not fatal
                    row[key] = str(exc)[:120]
            timed = {key: v for key, v in row.items() if key.startswith("m") and not key.endswith("_err")
                     and isinstance(v, float)}
            best = min(timed, key=timed.get)
            out[f"C{c}_b{b}_f{frames}"] = {**row, "best": best}
            print(f"C={c:3d} {b:2d}x{frames:2d} rows={b * length:6d}: three launches "
                  f"{row['three_launches_us']:7.2f} us, best {best} {timed[best]:7.2f} us, "
                  f"max err {row[best + '_err']:.4f}", flush=True)
    return out


def snake_sweep(repeats) -> dict:
    """The SnakeBeta launch alone at the 16-row, 16-frame piece's widths for tile sizes and warps (GPU us)."""
    from engine.kernels import snake

    g = torch.Generator(device="cuda").manual_seed(1)
    out = {}
    for c, per_frame in WIDTHS:
        x = torch.randn(16, per_frame * 16, c, device="cuda", generator=g).bfloat16()
        f, m = (torch.rand(c, device="cuda", generator=g).bfloat16() + 0.5 for _ in range(2))
        row = {}
        for tile in (1024, 2048, 4096, 8192):
            for warps in (4, 8):
                row[f"t{tile}_w{warps}"] = round(graph_time_us(
                    lambda cfg={"TILE": tile, "num_warps": warps}: snake.snake(x, f, m, config=cfg), 20, repeats), 2)
        out[f"C{c}"] = row
        print(f"snake C={c}: " + "  ".join(f"{key} {v}" for key, v in row.items()), flush=True)
    return out


def sine_mismatch() -> dict:
    """How often the bf16 SnakeBeta output changes with the hardware sine of the reduced argument instead of
    libdevice sinf (elements that differ, and by how many ulps at most), on activations like the codec's."""
    from engine.kernels import snake

    g = torch.Generator(device="cuda").manual_seed(3)
    x = (torch.randn(16, 30720, 96, device="cuda", generator=g) * 3).bfloat16()
    f = (torch.randn(96, device="cuda", generator=g) * 0.5).exp().bfloat16()
    m = (1.0 / ((torch.randn(96, device="cuda", generator=g) * 0.5).exp() + 1e-9)).bfloat16()
    fast = snake.snake(x, f, m)
    with fast_sine_for(()):
        accurate = snake.snake(x, f, m)
    steps = (fast.view(torch.int16).int() - accurate.view(torch.int16).int()).abs()  # same sign: ulps apart
    return {"elements": x.numel(), "differ": int((fast != accurate).sum()), "max_ulps": int(steps.max())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.inference_mode():
        if args.sweep:
            res["snake_sweep"] = snake_sweep(args.repeats)
            res["sweep"] = sweep(args.repeats)
    dec = build_decoder()
    ref_dec = build_decoder(torch.float32)
    torch.nn.functional.conv1d(torch.zeros(1, 8, 8, device="cuda", dtype=torch.bfloat16),
                               torch.zeros(8, 8, 3, device="cuda", dtype=torch.bfloat16))
    with torch.inference_mode():
        g = torch.Generator().manual_seed(5)
        codes45 = torch.randint(0, dec.cfg.codebook_size, (2, dec.cfg.num_quantizers, 45), generator=g).cuda()
        ref = ref_dec(codes45, check=False).float()
        del ref_dec
        res["variants"] = {}
        audio = {}
        for name, (names, fast) in VARIANTS.items():
            row = run_variant(dec, names, fast, ref, codes45, args.repeats)
            audio[name] = row.pop("audio")
            audio[name + "_eager"] = row.pop("eager_audio")
            res["variants"][name] = row
            print(f"{name:13s} replay ms {row['replay_ms']}  16x16 eager: {row['profile_16x16']['kernels']} kernels, "
                  f"{row['profile_16x16']['summed_us']} us  vs fp32 {row['vs_fp32_one_pass_max_abs']}", flush=True)
        res["audio_max_abs_vs_accurate_sin"] = {
            n: (a - audio["accurate_sin_eager" if n.endswith("_eager") else "accurate_sin"]).abs().max().item()
            for n, a in audio.items()}
        print("audio vs accurate_sin:", res["audio_max_abs_vs_accurate_sin"], flush=True)
        res["sine_mismatch"] = sine_mismatch()
        print("snake outputs, hardware against libdevice sine:", res["sine_mismatch"], flush=True)
        for name in ("fused",):
            print(name)
            for r in res["variants"][name]["profile_16x16"]["ops_by_shape"][:25]:
                print(f"   {r['count']:4d} {r['us']:8.1f} us  {r['op']} {r['shapes'][:100]}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
