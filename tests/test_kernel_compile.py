"""The decode attention kernels compile for an H100 (sm_90) on a machine without a GPU.

The interpreter tests (test_kernels.py) run the kernels' Python; they cannot see what Triton's compiler
rejects (a branch it cannot fold, a tuple returned from a helper, a layout it cannot build). Triton's
wheel carries ptxas, so the whole compile to a cubin runs here. Shapes of the 0.6B / 1.7B models, bf16,
PDL on, each launch path of attention.py with and without the fused q/k norm + RoPE prologue."""
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

POINTERS = {"pos_ptr": "*i64", "acc_ptr": "*fp32", "ml_ptr": "*fp32", "count_ptr": "*i32"}
SCALARS = {"scale": "fp32", "eps": "fp32"}


def _compile(fn, constexprs: dict, **options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = POINTERS.get(name, "*bf16")
        else:
            sig[name] = SCALARS.get(name, "i32")
    return triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32), options=options)


@pytest.mark.parametrize("rope, splice", [(False, False), (True, False), (True, True)])
def test_attention_kernels_compile_for_sm90(monkeypatch, rope, splice):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from engine.kernels import attention as ka
    from engine.kernels import linear as kl
    from engine.kernels import qk_norm_rope_kv as kq

    for module in (kl, kq, ka):  # built again, without the interpreter (a jit made under it only interprets)
        module._kernel.cache_clear()
    single, split = ka._kernel()
    common = {"G": 2, "D": 128, "ROPE": rope, "NH": 16, "NKV": 8, "EMULATE_RNE": False, "SPLICE": splice,
              "PDL": True}
    _compile(single, {**common, "GP": 2, "BLOCK_N": 16}, num_warps=2)
    _compile(split, {**common, "GP": 2, "R": 16, "BLOCK_N": 32, "SP": 8, "SB": 8, "USE_DOT": True, "IEEE": False},
             num_warps=4, num_stages=2)
