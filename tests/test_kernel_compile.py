"""Every Triton kernel the engine launches compiles for an H100 (sm_90) on a machine without a GPU.

The interpreter tests (test_kernels.py) run the kernels' Python; they cannot see what Triton's compiler
rejects (a branch it cannot fold, a helper's tuple, a layout it cannot build, a register budget). Triton's
wheel carries ptxas, so the whole compile to a cubin runs here. Here the launchers run as in
engine/kernels/selftest.py, at the 0.6B / 1.7B shapes in bf16 with PDL on, but each launch only compiles
(tests/sm90_compile.py; no result is checked). The opt-in persistent predictor pass compiles here too (its
residency check, which needs a loaded binary on a device, is left to tests/gpu/test_predictor_pass_gpu.py)."""
import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture
def compile_only():
    """Launches compile for sm_90 instead of running; yields the set of distinct compiles done."""
    from tests.sm90_compile import compile_only as compiling

    with compiling() as done:
        yield done


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
