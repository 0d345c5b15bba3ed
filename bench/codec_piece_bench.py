"""GPU time of the codec decoder's captured pieces (engine/gpu/codec_graph.py), per piece size and batch bucket.

    python bench/codec_piece_bench.py [--snake on|off] [--fold on|off] [--out FILE.json] [--save FILE.pt]
    python bench/codec_piece_bench.py --conv-probe [--out FILE.json]
    python bench/codec_piece_bench.py --conv-variants [--out FILE.json]

Builds the real-size codec decoder (every published checkpoint ships the same one) with deterministic
random weights (SnakeBeta's alpha / beta perturbed so the activations are not all alike), bf16 on CUDA,
then, as Engine.load does:
  * captures every piece for 1 row and for 16 rows, timing each bucket's capture (load pays the 1-row one);
  * replays each captured graph back to back: GPU ms per piece (CUDA events, mean of --repeats);
  * profiles one eager 1- and 32-frame piece (1 row): kernels, summed GPU us, the top kernels by time;
  * checks a 45-frame whole decode through the pieces against one eager pass (max abs difference) and, with
    --save, writes the piece output so two trees can be compared bit for bit.
--snake on runs SnakeBeta as the Triton kernel; --fold sets decoder.FOLD_DILATED_CONVS. --conv-probe instead times every conv shape of a 1- and
32-frame piece alone, under cuDNN's heuristics and under benchmark mode, and names the kernels each runs;
--conv-variants times other ways to run the k=7 convs (channels-last, dilation folded into a 2-D conv);
--snake-exactness counts the elements where the Triton SnakeBeta differs from torch's expression.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.checkpoint import presets
from engine.checkpoint.random_init import init_module
from engine.codec.config import CodecConfig
from engine.codec.decoder import CodecDecoder, SnakeBeta
from kernel_bench import graph_time_us  # bench/ is on sys.path when a bench runs
from timing import cuda_kernels, mean_gpu_ms


def build_decoder(dtype=torch.bfloat16) -> CodecDecoder:
    cfg = CodecConfig.from_dict(presets.codec_config("0.6b"))
    dec = CodecDecoder(cfg.decoder)
    init_module(dec, seed=0, prefix="decoder.")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in dec.modules():
            if isinstance(m, SnakeBeta):
                m.alpha.copy_(torch.randn(m.alpha.shape, generator=g) * 0.5)
                m.beta.copy_(torch.randn(m.beta.shape, generator=g) * 0.5)
    return dec.to("cuda", dtype).eval()


def kernel_table(fn) -> dict:
    rows = cuda_kernels(fn)
    return {"kernels": sum(r["count"] for r in rows), "summed_us": round(sum(r["us"] for r in rows), 1),
            "top": rows[:12]}


def pieces_bench(args) -> dict:
    from engine.codec import decoder as codec_decoder

    if args.fold != "default":
        if not hasattr(codec_decoder, "FOLD_DILATED_CONVS"):
            raise SystemExit("this tree has no folded dilated convs")
        codec_decoder.FOLD_DILATED_CONVS = args.fold == "on"
    dec = build_decoder()  # outside inference mode, as the engine's loader builds it
    if args.snake == "on":
        from engine import kernels

        if not hasattr(dec, "use_kernels"):
            raise SystemExit("this tree has no Triton SnakeBeta")
        dec.use_kernels(kernels.Kernels(["snake"]))
    with torch.inference_mode():
        return _pieces_bench(args, dec)


def _pieces_bench(args, dec) -> dict:
    from engine.gpu.codec_graph import PIECES, CodecGraphs

    # the engine captures after the talker has run: CUDA, cuBLAS and cuDNN are initialised by then
    torch.nn.functional.conv1d(torch.zeros(1, 8, 8, device="cuda", dtype=torch.bfloat16),
                               torch.zeros(8, 8, 3, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    graphs = CodecGraphs(dec)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "snake": args.snake, "fold": args.fold,
           "capture_s": {}, "replay_ms": {}, "profile": {}}
    for bucket in (1, 16):
        before = graphs.capture_seconds
        t = time.perf_counter()
        graphs.precapture([bucket])
        torch.cuda.synchronize()
        out["capture_s"][bucket] = {"graphs": round(graphs.capture_seconds - before, 3),
                                    "wall": round(time.perf_counter() - t, 3)}
        print(f"capture {bucket:2d} rows: {out['capture_s'][bucket]}", flush=True)
    assert graphs.failure is None, graphs.failure
    for bucket in (1, 16):
        out["replay_ms"][bucket] = {}
        for size in PIECES:
            graph = graphs.graphs[(bucket, size)][0]
            out["replay_ms"][bucket][size] = round(mean_gpu_ms(graph.replay, args.repeats), 4)
        print(f"replay ms, {bucket:2d} rows: " + "  ".join(f"{s}f {ms:.3f}" for s, ms in out["replay_ms"][bucket].items()),
              flush=True)
    state = graphs.state(1)
    q = dec.cfg.num_quantizers
    for frames in (1, 32):
        codes = torch.zeros(1, q, frames, dtype=torch.long, device="cuda")
        table = kernel_table(lambda c=codes: dec(c, state, check=False))
        out["profile"][frames] = table
        print(f"eager {frames:2d}-frame piece: {table['kernels']} kernels, {table['summed_us']} us summed", flush=True)
        for r in table["top"]:
            print(f"   {r['count']:4d} {r['us']:8.1f} us  {r['kernel']}")
    # a whole decode through the pieces (32 + 13 padded as 16) against one eager pass
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, dec.cfg.codebook_size, (2, q, 45), generator=g).cuda()
    ref = dec(codes, check=False).float()
    got = []
    for row in range(2):  # bucket 1, one row at a time; then both rows in bucket 16 (zero rows added)
        graphs.state(1).zero_()
        got.append(graphs.decode(codes[row: row + 1], graphs.state(1), final=True).float())
    graphs.state(16).zero_()
    got16 = graphs.decode(codes, graphs.state(16), final=True).float()
    got = torch.cat(got)
    out["whole_vs_one_pass_max_abs"] = {"bucket1": (got - ref).abs().max().item(),
                                        "bucket16": (got16 - ref).abs().max().item()}
    print(f"whole decode through pieces vs one eager pass: {out['whole_vs_one_pass_max_abs']}", flush=True)
    if args.save:
        torch.save({"pieces": got.cpu(), "pieces16": got16.cpu(), "one_pass": ref.cpu()}, args.save)
    return out


def conv_probe(args) -> dict:
    """Every conv of a 1- and 32-frame piece alone: kernels and GPU us under heuristics and benchmark mode."""
    from torch import nn

    dec = build_decoder()
    seen = {}

    def hook(module, inputs):
        key = (type(module).__name__, tuple(module.weight.shape), module.stride, module.dilation, module.groups,
               tuple(inputs[0].shape))
        seen.setdefault(key, (module, inputs[0].shape))

    handles = [m.register_forward_pre_hook(hook) for m in dec.modules()
               if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    with torch.inference_mode():
        for frames in (1, 32):
            dec(torch.zeros(1, dec.cfg.num_quantizers, frames, dtype=torch.long, device="cuda"), check=False)
    for h in handles:
        h.remove()
    rows = []
    saved = torch.backends.cudnn.benchmark
    try:
        with torch.inference_mode():
            for key, (module, shape) in seen.items():
                x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                row = {"conv": f"{key[0]} w{list(key[1])} s{key[2]} d{key[3]} g{key[4]} x{list(shape)}"}
                for mode in (False, True):
                    torch.backends.cudnn.benchmark = mode
                    table = kernel_table(lambda m=module, x=x: m(x))
                    row["bench" if mode else "heur"] = {"us": table["summed_us"], "kernels": table["kernels"],
                                                        "top": [(r["kernel"][:60], r["count"], r["us"])
                                                                for r in table["top"][:3]]}
                rows.append(row)
                print(f"{row['conv']}\n   heur {row['heur']['us']:8.1f} us {row['heur']['top']}\n"
                      f"   bench {row['bench']['us']:8.1f} us {row['bench']['top']}", flush=True)
    finally:
        torch.backends.cudnn.benchmark = saved
    total = {m: round(sum(r[m]["us"] for r in rows), 1) for m in ("heur", "bench")}
    print(f"all conv shapes once: {total}")
    return {"gpu": torch.cuda.get_device_name(), "convs": rows, "total_us": total}


def conv_variants(args) -> dict:
    """The k=7 convs of the wave blocks (input with its causal left context, as the decoder runs them) four
    ways: torch's conv1d; channels-last (weight stored NHWC once, input and output converted per call);
    dilation folded: the input viewed as [B, C, L/d, d] and a (7, 1) kernel, the same sums as the dilated
    conv (zero-padded on the right to a multiple of d, the extra outputs dropped); and folded + channels-last."""
    import torch.nn.functional as F
    from torch import nn

    dec = build_decoder()
    cl = torch.channels_last
    rows = []
    convs = [m for m in dec.decoder.modules() if isinstance(m, nn.Conv1d) and m.kernel_size[0] == 7
             and m.in_channels == m.out_channels]
    seen = set()
    with torch.inference_mode():
        for conv in convs:
            c, d = conv.in_channels, conv.dilation[0]
            if (c, d) in seen:
                continue
            seen.add((c, d))
            w, bias = conv.weight, conv.bias
            w_cl = w.unsqueeze(2).contiguous(memory_format=cl)  # [O, I, 1, 7] NHWC
            w_fold = w.unsqueeze(-1)  # [O, I, 7, 1]
            w_fold_cl = w_fold.contiguous(memory_format=cl)
            spf = {1536: 4, 768: 32, 384: 160, 192: 640, 96: 1920}[c]  # samples per frame at this width
            for batch, frames in ((1, 1), (1, 32), (16, 1), (16, 32)):
                n = spf * frames
                x = torch.randn(batch, c, 6 * d + n, device="cuda", dtype=torch.bfloat16)
                pad = (-x.shape[-1]) % d

                def fold(x=x, pad=pad, wf=w_fold, n=n, d=d, bias=bias):
                    xp = F.pad(x, (0, pad)) if pad else x
                    b_, c_, length = xp.shape
                    y = F.conv2d(xp.view(b_, c_, length // d, d), wf, bias)
                    return y.reshape(b_, y.shape[1], -1)[..., :n]

                def fold_cl(x=x, pad=pad, n=n, d=d, bias=bias, wf=w_fold_cl):
                    xp = F.pad(x, (0, pad)) if pad else x
                    b_, c_, length = xp.shape
                    y = F.conv2d(xp.view(b_, c_, length // d, d).contiguous(memory_format=cl), wf, bias)
                    return y.contiguous().reshape(b_, y.shape[1], -1)[..., :n]

                variants = {
                    "torch": lambda x=x, conv=conv: conv(x),
                    "cl": lambda x=x, w=w_cl, bias=bias, d=d: F.conv2d(
                        x.unsqueeze(2).contiguous(memory_format=cl), w, bias, dilation=(1, d)).squeeze(2).contiguous(),
                    "fold": fold, "fold_cl": fold_cl,
                }
                ref = conv(x).float()
                row = {"c": c, "d": d, "batch": batch, "frames": frames}
                for name, fn in variants.items():
                    if d == 1 and name.startswith("fold"):
                        continue
                    diff = (fn().float() - ref).abs().max().item()
                    row[name] = round(graph_time_us(fn, inner=10, reps=10), 1)
                    row[name + "_maxdiff"] = diff
                rows.append(row)
                print("  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return {"gpu": torch.cuda.get_device_name(), "rows": rows}


def snake_exactness(args) -> dict:
    """The Triton SnakeBeta against torch's expression, element by element, at the codec's shapes (bf16, fp32)."""
    from engine.kernels import selftest as st
    from engine.kernels import snake as k

    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        for c, length in st.SNAKE_SHAPES:
            g = torch.Generator().manual_seed(c)
            x = (torch.randn(16, c, length, generator=g) * 3).to(dtype).cuda()
            freq = (torch.randn(c, generator=g) * 0.5).exp().to(dtype).cuda()
            inv = (1.0 / ((torch.randn(c, generator=g) * 0.5).exp() + 1e-9)).to(dtype).cuda()
            got, want = k.snake(x, freq, inv), k.reference(x, freq, inv)
            diff = (got.float() - want.float()).abs()
            key = f"{str(dtype)[6:]} C={c} L={length}"
            out[key] = {"mismatched": int((diff > 0).sum()), "of": diff.numel(), "max_abs": diff.max().item()}
            print(key, out[key], flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--snake", choices=("on", "off"), default="off")
    ap.add_argument("--conv-variants", action="store_true")
    ap.add_argument("--snake-exactness", action="store_true")
    ap.add_argument("--fold", choices=("on", "off", "default"), default="default")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--conv-probe", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--save", default=None)
    args = ap.parse_args()
    if args.conv_probe:
        out = conv_probe(args)
    elif args.conv_variants:
        out = conv_variants(args)
    elif args.snake_exactness:
        out = snake_exactness(args)
    else:
        out = pieces_bench(args)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
