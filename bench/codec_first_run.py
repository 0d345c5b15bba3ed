"""What a codec piece's first run costs over its second, and which library pays it (engine load, issue 10).

    python bench/codec_first_run.py --out DIR

Each variant runs in a fresh process on the 0.6B checkpoint's codec (bf16, CUDA): the first tiny conv1d
and the first masked attention of the process (library start-up), the first 1-frame decode, then each
piece size decoded twice, eagerly. first - second is the per-shape set-up a load pays once per piece.
Variants switch one suspect off: the cuDNN attention backend, cuDNN convolutions (no_cudnn: both), the Triton
snake kernel. thread_first (the engine's settings) first decodes one frame and every piece on another thread, on
its own state: what is left for this thread is what the libraries keep per thread (cuDNN's plans), the rest
(library and kernel loading) is per process. The first run of the 16-frame piece is profiled on the host: which
ops pay the per-shape set-up.
Writes DIR/codec_first_run_<gpu>.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gpu_bench import checkpoint
from timing import gpu_tag, run_fresh

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("default", "no_cudnn_sdp", "efficient_sdp_only", "no_cudnn_conv", "no_cudnn", "deterministic",
            "no_snake_kernel", "thread_first")
SIZES = (32, 16, 8, 4, 2)
PROFILED = 16  # the piece whose first run is profiled on the host (the profiler adds its own time)


def worker(ckpt: Path, variant: str) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from engine import kernels
    from engine.checkpoint.loader import materialize
    from engine.codec.config import CodecConfig
    from engine.codec.decoder import CodecDecoder, DecodeState

    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    # the engine runs attention without cuDNN's backend (model.layers.sdpa): no_cudnn_sdp and those built on it
    if variant in ("no_cudnn_sdp", "no_cudnn", "deterministic", "thread_first"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    if variant == "efficient_sdp_only":
        for name in ("cudnn", "flash", "math"):
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(False)
    if variant == "deterministic":  # cuDNN builds plans only for its deterministic engines
        torch.backends.cudnn.deterministic = True
    if variant in ("no_cudnn_conv", "no_cudnn"):
        torch.backends.cudnn.enabled = False

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t)

    out = {"variant": variant}
    codec_dir = ckpt / "speech_tokenizer"
    cfg = CodecConfig.from_file(codec_dir / "config.json")
    t = time.perf_counter()
    dec = materialize(lambda: CodecDecoder(cfg.decoder), dev, torch.bfloat16, codec_dir / "model.safetensors", "decoder.")
    out["weights_ms"] = 1000 * (time.perf_counter() - t)
    ks, _ = kernels.select("auto", dev)
    if variant != "no_snake_kernel":
        dec.use_kernels(ks)
    x = torch.randn(1, 64, 40, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, 64, 7, device=dev, dtype=torch.bfloat16)
    out["first_conv1d_ms"] = timed(lambda: F.conv1d(x, w))
    q = torch.randn(1, 16, 8, 64, device=dev, dtype=torch.bfloat16)
    mask = torch.ones(8, 8, dtype=torch.bool, device=dev).tril()
    out["first_sdpa_ms"] = timed(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    if variant == "thread_first":
        import threading

        def other_thread():
            with torch.inference_mode():
                other = DecodeState()
                for size in (1,) + SIZES:
                    dec(torch.zeros(1, cfg.decoder.num_quantizers, size, dtype=torch.long, device=dev), other,
                        check=False)
                torch.cuda.synchronize()

        def on_thread():
            th = threading.Thread(target=other_thread)
            th.start()
            th.join()

        out["thread_decodes_ms"] = timed(on_thread)
    state = DecodeState()
    with torch.inference_mode():
        codes = torch.zeros(1, cfg.decoder.num_quantizers, 1, dtype=torch.long, device=dev)
        out["first_decode_1f_ms"] = timed(lambda: dec(codes, state, check=False))
        out["second_decode_1f_ms"] = timed(lambda: dec(codes, state, check=False))
        for size in SIZES:
            codes = torch.zeros(1, cfg.decoder.num_quantizers, size, dtype=torch.long, device=dev)
            if size == PROFILED:  # which ops pay the per-shape set-up: host time of each op on its first run
                cpu = [torch.profiler.ProfilerActivity.CPU]
                with torch.profiler.profile(activities=cpu, record_shapes=True) as prof:
                    first = timed(lambda c=codes: dec(c, state, check=False))
                convs = [e for e in prof.key_averages(group_by_input_shape=True) if "convolution" in e.key]
                out[f"first_piece{size}_conv_shapes_ms"] = [
                    [e.key, str(e.input_shapes)[:120], round(e.self_cpu_time_total / 1000, 2), e.count]
                    for e in sorted(convs, key=lambda e: -e.self_cpu_time_total)[:20]]
                ops = sorted((e for e in prof.key_averages() if e.key.startswith(("aten::", "cudnn", "cuda"))),
                             key=lambda e: -e.self_cpu_time_total)
                out[f"first_piece{size}_host_ops_ms"] = {e.key: [round(e.self_cpu_time_total / 1000, 2), e.count]
                                                         for e in ops[:15]}
            else:
                first = timed(lambda c=codes: dec(c, state, check=False))
            second = timed(lambda c=codes: dec(c, state, check=False))
            out[f"piece{size}"] = {"first_ms": first, "second_ms": second}
        codes = torch.zeros(1, cfg.decoder.num_quantizers, 32, dtype=torch.long, device=dev)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            dec(codes, state, check=False)
            torch.cuda.synchronize()
        kinds = {}
        for e in prof.key_averages():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kinds[e.key[:90]] = round(e.device_time_total / 1000, 3)
        out["kernels_32f_ms"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:25])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--ckpt", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.ckpt, args.worker)))
        return
    import torch

    gpu = torch.cuda.get_device_name(0)
    ckpt = checkpoint("0.6b")
    rows = []
    for variant in args.variants:
        r = run_fresh(__file__, ["--worker", variant, "--ckpt", str(ckpt)])
        if "error" in r:
            print(variant, r["error"])
            continue
        rows.append(r)
        setup = sum(r[f"piece{s}"]["first_ms"] - r[f"piece{s}"]["second_ms"] for s in SIZES)
        print(f"{variant:20s} conv {r['first_conv1d_ms']:7.1f}  sdpa {r['first_sdpa_ms']:7.1f}  1f first/second "
              f"{r['first_decode_1f_ms']:7.1f}/{r['second_decode_1f_ms']:5.1f}  pieces set-up {setup:7.1f} ms  "
              + "  ".join(f"{s}:{r[f'piece{s}']['first_ms']:.0f}/{r[f'piece{s}']['second_ms']:.1f}" for s in SIZES),
              flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = gpu_tag()
    (args.out / f"codec_first_run_{name}.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=2))
    for r in rows[:1]:
        print(json.dumps(r["kernels_32f_ms"], indent=1))
    for r in rows:
        print(r["variant"], json.dumps(r.get(f"first_piece{PROFILED}_host_ops_ms"), indent=1))
        for row in r.get(f"first_piece{PROFILED}_conv_shapes_ms", []):
            print("   ", row)


if __name__ == "__main__":
    main()
