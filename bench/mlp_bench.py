"""The one-launch MLP (engine/kernels/mlp.py) against the two linear launches it replaces, in one process.

    python bench/mlp_bench.py --out DIR [--sizes 0.6b 1.7b] [--takes 1 2] [--skip-chain] [--skip-frames]

* chain: a CUDA graph of 32 layers' MLPs back to back (each its own weights, past L2; PDL on), the two
  linears against the one launch at each launch shape in CONFIGS: microseconds a layer.
* frames: a real-size random CustomVoice checkpoint (bench/gpu_bench.py), Triton on; the whole-frame graph
  replayed 200 times (best of 3) with the mlp kernel on, off, on again (recaptured between), and the kernels a
  frame (one profiled eager frame body).
Writes DIR/mlp_<gpu>.json after every step and prints each row.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CONFIGS = ({}, {"BI": 32}, {"BI": 8}, {"num_warps": 4}, {"PRELOAD_DOWN": True}, {"CW": 64}, {"CW": 16})
LAYERS = 32


def chain_us(run, layers: int) -> float:
    """Microseconds a layer of `run()` (one pass over every layer) captured as one graph, best of 3."""
    from timing import mean_gpu_ms

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return min(mean_gpu_ms(graph.replay, 50) for _ in range(3)) * 1e3 / layers


def chain(hidden: int, inter: int, rows: int) -> list:
    from engine.kernels import Kernels, mlp

    dt = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dt)

    layers = [(rand(2 * inter, hidden, scale=hidden ** -0.5), rand(hidden) * 0.1 + 1,
               rand(hidden, inter, scale=inter ** -0.5)) for _ in range(LAYERS)]
    x0 = rand(rows, 1, hidden)
    two = Kernels(("linear",), pdl=True)
    state = {}

    def run_two():
        x = x0
        for gu, nw, dn in layers:
            x = two.mlp(x, gu, nw, 1e-6, dn)
        state["two"] = x

    def run_one(cfg):
        def run():
            x = x0
            for gu, nw, dn in layers:
                x = mlp.mlp(x, gu, nw, 1e-6, dn, pdl=True, config=cfg)
            state["one"] = x
        return run

    rows_out = [{"hidden": hidden, "inter": inter, "rows": rows, "variant": "two linears",
                 "us_per_layer": round(chain_us(run_two, LAYERS), 2)}]
    print(json.dumps(rows_out[-1]), flush=True)
    for cfg in CONFIGS:
        us = chain_us(run_one(cfg), LAYERS)
        diff = (state["one"].float() - state["two"].float()).abs().max().item()
        rows_out.append({"hidden": hidden, "inter": inter, "rows": rows, "variant": f"mlp {cfg or 'default'}",
                         "us_per_layer": round(us, 2), "max_abs_diff_after_32_layers": diff})
        print(json.dumps(rows_out[-1]), flush=True)
    rows_out.append({"hidden": hidden, "inter": inter, "rows": rows, "variant": "two linears again",
                     "us_per_layer": round(chain_us(run_two, LAYERS), 2)})
    print(json.dumps(rows_out[-1]), flush=True)
    return rows_out


def frames(size: str, takes_list) -> list:
    from gpu_bench import TEXT, checkpoint
    from profile_frame import recaptured_frame

    from engine import Engine, Request
    from engine.kernels import Kernels

    eng = Engine.load(checkpoint(size), device="cuda", dtype="bf16", cuda_graphs="on", triton="on", max_seq_len=1024)
    stacks = [eng.runner.fused["talker"], eng.runner.fused["predictor"]]
    on = [Kernels(st.ks.active + ("mlp",), pdl=st.ks.pdl) for st in stacks]  # the talker's may differ (attention)
    req = Request(mode="custom", text=TEXT, language="English", speaker="ryan")
    out = []
    for takes in takes_list:
        eng.generate(req, takes=takes, seed=0, params=eng.defaults.replace(max_new_tokens=64))
        for name, use in (("mlp on", True), ("mlp off", False), ("mlp on again", True)):
            for st, ks in zip(stacks, on):
                st.ks = ks if use else ks.without("mlp")
            ms, count = recaptured_frame(eng)
            out.append({"size": size, "takes": takes, "variant": name, "ms_per_frame": round(ms, 3),
                        "kernels_per_frame": count})
            print(json.dumps(out[-1]), flush=True)
    for st, ks in zip(stacks, on):
        st.ks = ks
    del eng
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", nargs="+", default=["0.6b", "1.7b"])
    ap.add_argument("--takes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip-chain", action="store_true")
    ap.add_argument("--skip-frames", action="store_true")
    args = ap.parse_args()
    import triton
    from timing import gpu_tag

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "chain": [], "frames": []}
    path = out / f"mlp_{gpu_tag()}.json"

    def save():
        path.write_text(json.dumps(result, indent=1))

    if not args.skip_chain:
        for hidden, inter in ((1024, 3072), (2048, 6144)):
            for rows in (1, 2):
                result["chain"] += chain(hidden, inter, rows)
                save()
    if not args.skip_frames:
        for size in args.sizes:
            result["frames"] += frames(size, args.takes)
            save()


if __name__ == "__main__":
    main()
