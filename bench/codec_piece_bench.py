"""GPU time of the codec decoder's captured pieces (engine/gpu/codec_graph.py), per piece size and batch bucket.

    python bench/codec_piece_bench.py [--snake on|off] [--fold on|off] [--out FILE.json] [--save FILE.pt]
    python bench/codec_piece_bench.py --snake-exactness [--out FILE.json]

Builds the real-size codec decoder (every published checkpoint ships the same one) with deterministic
random weights (SnakeBeta's alpha / beta perturbed so the activations are not all alike), bf16 on CUDA,
then, as Engine.load does:
  * captures every piece for 1 row and for 16 rows, timing each bucket's capture (load pays the 1-row one);
  * replays each captured graph back to back: GPU ms per piece (CUDA events, mean of --repeats);
  * profiles one eager 1- and 32-frame piece of 1 row and a 16-frame piece of 16 rows: kernels, summed GPU us,
    the top kernels by time;
  * checks a 45-frame whole decode through the pieces against one eager pass (max abs difference) and, with
    --save, writes the piece output so two trees can be compared bit for bit.
--snake on runs SnakeBeta as the Triton kernel; --fold sets decoder.FOLD_DILATED_CONVS. --snake-exactness counts
the elements where the Triton SnakeBeta differs from torch's expression. (The --conv-probe and --conv-variants
modes, which timed each conv of the [B, C, L] layout alone, went with that layout; their results are in
bench/results/codec_pieces_h200.json.)
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
    ops, by_shape = op_tables(fn)
    return {"kernels": sum(r["count"] for r in rows), "summed_us": round(sum(r["us"] for r in rows), 1),
            "top": rows[:20], "ops": ops, "ops_by_shape": by_shape}


def op_tables(fn) -> tuple[list, list]:
    """GPU time by the torch op that launched it (which op a generic elementwise kernel belongs to), and by op
    and input shapes (which activation a copy or an add is), from one profiled call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        fn()
        torch.cuda.synchronize()

    def table(by_shape: bool, top: int) -> list:
        events = prof.key_averages(group_by_input_shape=by_shape)
        ops = sorted((e for e in events if e.key.startswith("aten::") and e.self_device_time_total > 0),
                     key=lambda e: -e.self_device_time_total)
        return [{"op": e.key[:60], "count": e.count, "us": round(e.self_device_time_total, 1),
                 **({"shapes": str(e.input_shapes)[:120]} if by_shape else {})} for e in ops[:top]]

    return table(False, 20), table(True, 30)


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
    q = dec.cfg.num_quantizers
    for rows, frames in ((1, 1), (1, 32), (16, 16)):  # the last: what 16 takes decode beside their frames
        state = graphs.state(rows)
        codes = torch.zeros(rows, q, frames, dtype=torch.long, device="cuda")
        table = kernel_table(lambda c=codes: dec(c, state, check=False))
        out["profile"][frames if rows == 1 else f"{rows}x{frames}"] = table
        print(f"eager {frames:2d}-frame piece, {rows} rows: {table['kernels']} kernels, {table['summed_us']} us summed",
              flush=True)
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


def snake_exactness(args) -> dict:
    """The Triton SnakeBeta against torch's expression, element by element, at the codec's shapes (bf16, fp32)."""
    from engine.kernels import selftest as st
    from engine.kernels import snake as k

    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        for c, length in st.SNAKE_SHAPES:
            g = torch.Generator().manual_seed(c)
            x = (torch.randn(16, length, c, generator=g) * 3).to(dtype).cuda()  # time-major [B, L, C]
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
    ap.add_argument("--snake-exactness", action="store_true")
    ap.add_argument("--fold", choices=("on", "off", "default"), default="default")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--save", default=None)
    args = ap.parse_args()
    if args.snake_exactness:
        out = snake_exactness(args)
    else:
        out = pieces_bench(args)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
