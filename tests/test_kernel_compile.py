"""Every Triton kernel the engine launches compiles for an H100 (sm_90) on a machine without a GPU.

The interpreter tests (test_kernels.py) run the kernels' Python; they cannot see what Triton's compiler
rejects (a branch it cannot fold, a helper's tuple, a layout it cannot build, a register budget). Triton's
wheel carries ptxas, so the whole compile to a cubin runs here. Here the launchers run as in
engine/kernels/selftest.py, at the 0.6B / 1.7B shapes in bf16 with PDL on, but each launch only compiles
(JITFunction.run is swapped for a compile of the same signature, constexprs and options; no result is
checked). The opt-in persistent predictor pass compiles here too (its residency check, which needs a
loaded binary on a device, is left to tests/gpu/test_predictor_pass_gpu.py)."""
import importlib.util
import inspect

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
           torch.int32: "*i32", torch.uint8: "*u8", torch.bool: "*i1"}


def _signature(jit_fn, args, kwargs):
    """(signature, constexprs, options) of one launch, as Triton's launcher would bind them."""
    defaults = inspect.signature(jit_fn.fn).parameters
    values = dict(zip((p.name for p in jit_fn.params), args))
    options = {}
    for key, value in kwargs.items():
        (values if key in defaults else options)[key] = value
    sig, consts = {}, {}
    for p in jit_fn.params:
        v = values[p.name] if p.name in values else defaults[p.name].default
        if p.is_constexpr or v is None:
            sig[p.name], consts[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = POINTER[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        else:
            sig[p.name] = "fp32"
    return sig, consts, options


class _NotLoaded:
    """What a compile-only `warmup()` hands back: a kernel whose binary is never loaded."""

    def _init_handles(self):
        pass


@pytest.fixture
def compile_only(monkeypatch):
    """Launches compile for sm_90 instead of running; yields the set of distinct compiles done."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from engine.kernels import (
        attention,
        linear,
        predictor_pass,
        qk_norm_rope_kv,
        rms_norm,
        sample,
        selftest,
        snake,
    )

    modules = (linear, qk_norm_rope_kv, attention, rms_norm, sample, snake, predictor_pass)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for module in modules:
        module._kernel.cache_clear()  # built again without the interpreter (a jit made under it only interprets)
    done = set()

    def run(self, *args, grid, warmup, **kwargs):
        sig, consts, options = _signature(self, args, kwargs)
        key = (self.fn.__name__, tuple(sig.items()), repr(sorted(consts.items(), key=str)), repr(sorted(options.items())))
        if key not in done:
            triton.compile(ASTSource(self, sig, consts), target=GPUTarget("cuda", 90, 32), options=options)
            done.add(key)
        return _NotLoaded()

    monkeypatch.setattr(JITFunction, "run", run)
    monkeypatch.setattr(selftest, "_close", lambda *a, **k: None)  # the outputs were never computed
    monkeypatch.setattr(selftest, "_verdict", lambda *a, **k: None)
    yield done
    for module in modules:
        module._kernel.cache_clear()


ROWS = (1, 4, 16)
BF16 = torch.bfloat16


def test_linear_compiles(compile_only):
    from engine.kernels import selftest as st

    for m in ROWS:
        for n, k, prologue, residual, bias in st.LINEAR_SHAPES:
            st.check_linear("cpu", BF16, m, n, k, prologue, residual, bias)
    assert len(compile_only) >= 10


def test_attention_compiles(compile_only):
    from engine.kernels import selftest as st

    for m in ROWS:
        for w in (16, 256):
            st.check_attention("cpu", BF16, m, seq=max(64, w), window=w, filled=w - 3)
            st.check_rope_attention("cpu", BF16, m, seq=max(64, w), window=w, pos=w - 3 - m, per_row=m > 1)
    assert len(compile_only) >= 6


def test_norm_rope_sample_snake_compile(compile_only):
    from engine.kernels import selftest as st

    for m in ROWS:
        st.check_rms_norm("cpu", BF16, m, 1024)
        st.check_qk_norm_rope_kv("cpu", BF16, m, seq=64, per_row=m > 1)
    st.check_qk_norm_rope_kv_prefill("cpu", BF16, 5)
    from engine import sampling
    from engine.kernels import sample

    for vocab, dtype in ((2048, BF16), (3072, torch.float32)):  # the heads' bf16 ids (16-bit keys), fp32 logits
        logits, settings = st.sampling_case("cpu", 16, vocab, 0, dtype=dtype)
        sample.sample(logits, *settings, keys=sampling.take_keys(0, range(16), "cpu"), step=torch.tensor([3]), slot=0)
    st.check_sample_penalty("cpu", 16)
    for c, length in st.SNAKE_SHAPES[:3]:
        st.check_snake("cpu", BF16, 1, c, length)
    assert len(compile_only) >= 6


def test_predictor_pass_compiles(compile_only, monkeypatch):
    """The persistent pass at the 0.6B predictor's shapes (5 layers, 2048-id head), with its L2 prefetch (inline
    PTX, which the interpreter skips), at 1, 4 and 16 rows in bf16 and at 1 row in fp32 (the exact path)."""
    from engine.kernels import predictor_pass as kp
    from engine.kernels import selftest as st

    monkeypatch.setattr(kp, "resident_programs", lambda *a, **k: 1 << 20)  # needs a loaded binary on a GPU
    size = {"hidden": 1024, "inter": 3072, "layers": 5, "nh": 16, "nkv": 8, "d": 128}
    for dtype, rows in [(BF16, m) for m in ROWS] + [(torch.float32, 1)]:
        st.check_predictor_pass("cpu", dtype, rows, positions=2, vocab=2048, grid=132, **size)
    assert len(compile_only) >= 3
