"""Registers and spills of every decode and codec kernel as ptxas builds it for an H100 (sm_90), on a CPU.

    python bench/register_usage.py [--out DIR]

No GPU needed: the launches of tests/support/sm90_compile.py (the self-test's launchers at the model shapes, bf16,
PDL on, as the compile test makes them) run inside its compile_only(), which compiles each launch instead
of running it, and cuobjdump reads each cubin. A thread's registers cap how many programs an SM holds;
stack bytes are spills to local memory; a kernel's SASS instructions say how much code its programs fetch.
Each distinct compile is listed once, under the first row count that launched it. The device runs its own
Triton build (3.6; scripts/device_triton.sh installs it beside the venv's), whose allocation can differ a
lot: run this with it on PYTHONPATH to see the device's. Prints a markdown table and writes it with the raw
figures to DIR/registers_sm90.{md,json} (DIR: bench/results).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = (1, 2, 4, 16)
SHOWN = ("PROLOGUE", "RESIDUAL", "HAS_BIAS", "ONE_TILE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "USE_DOT", "SWAP_AB", "BN_W",
         "BK_W", "ROPE", "R", "SP", "SS_STEPS", "BLOCK", "KEY_BITS", "PENALTY", "EMBED", "EMBED2", "V", "BLOCK_T",
         "BLOCK_C", "HAS_TAIL", "FAST_SIN", "C", "N", "HAS_XB", "BI", "BK", "CW", "PP", "PR", "PRELOAD_DOWN")


def launches(rows_of: dict) -> None:
    """Every launcher once per shape class; `rows_of` names the rows of the launch being compiled."""
    from tests.support import sm90_compile as sm90

    for m in ROWS:
        rows_of["now"] = m
        for family in (sm90.linear_launches, sm90.attention_launches, sm90.mlp_launches, sm90.small_launches,
                       sm90.predictor_pass_launches, sm90.codec_launches):
            family(m)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    from tests.support.sm90_compile import compile_only, resource_usage

    found, rows_of = [], {"now": 0}

    def record(name, consts, options, compiled):
        shown = {k: consts[k] for k in SHOWN if k in consts}
        found.append({"kernel": name, "rows": rows_of["now"], "warps": options.get("num_warps", 4), **shown,
                      **resource_usage(compiled)})
        print(json.dumps(found[-1]), flush=True)

    with compile_only(record):
        launches(rows_of)
    lines = ["| kernel | rows | warps | tiles and flags | registers | stack (spill) B | SASS instructions |",
             "|---|---|---|---|---|---|---|"]
    for r in found:
        flags = ", ".join(f"{k} {r[k]}" for k in SHOWN if k in r)
        lines.append(f"| {r['kernel']} | {r['rows']} | {r['warps']} | {flags} | {r['regs']} | {r['stack']} | "
                     f"{r['instructions']} |")
    import triton

    head = (f"# Registers and spills for sm_90 (ptxas of Triton {triton.__version__}, compiled on a CPU)\n\n"
            "`python bench/register_usage.py`: each decode kernel at the 0.6B shapes and the codec's SnakeBeta "
            "kernels at its widths, bf16, PDL on; "
            "registers a thread, stack (spill) bytes a thread and the kernel's SASS instructions, from "
            "cuobjdump.\n\n")
    table = head + "\n".join(lines) + "\n"
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "registers_sm90.md").write_text(table)
    (args.out / "registers_sm90.json").write_text(json.dumps({"triton": triton.__version__, "kernels": found},
                                                             indent=1))


if __name__ == "__main__":
    main()
