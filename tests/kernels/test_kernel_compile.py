"""Every Triton kernel the engine launches compiles for an H100 (sm_90) on a machine without a GPU.

The interpreter tests (test_kernels.py) run the kernels' Python; they cannot see what Triton's compiler
rejects (a branch it cannot fold, a helper's tuple, a layout it cannot build, a register budget). Triton's
wheel carries ptxas, so the whole compile to a cubin runs here. Here the launchers run as in
engine/kernels/selftest.py, at the 0.6B / 1.7B shapes in bf16 with PDL on, but each launch only compiles
(tests/support/sm90_compile.py; no result is checked). The opt-in persistent predictor pass compiles here too (its
residency check, which needs a loaded binary on a device, is left to tests/gpu/test_predictor_pass_gpu.py)."""
import importlib.util

import pytest
import torch

from tests.support import sm90_compile as sm90

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture
def compile_only():
    """Launches compile for sm_90 instead of running; yields the set of distinct compiles done."""
    with sm90.compile_only() as done:
        yield done


ROWS = (1, 4, 16)


def test_linear_compiles(compile_only):
    for m in ROWS:
        sm90.linear_launches(m)
    assert len(compile_only) >= 10


def test_attention_compiles(compile_only):
    for m in ROWS:
        sm90.attention_launches(m)
    assert len(compile_only) >= 6
    assert any(key[0] == "attention_o_proj_kernel" for key in compile_only)
    assert any(key[0] == "split_kernel" and "('DEVICE_LENGTH', True)" in key[2] for key in compile_only)


def test_mlp_compiles(compile_only):
    """The one-launch MLP with the GPU's summing programs (their wait loop included), 1 and 2 rows."""
    for m in (1, 2):
        sm90.mlp_launches(m)
    assert len(compile_only) == 4


def test_norm_rope_sample_snake_compile(compile_only):
    from engine.kernels import selftest as st

    for m in ROWS:
        sm90.small_launches(m)
    st.check_qk_norm_rope_kv_prefill("cpu", sm90.BF16, 5)
    for c, length in st.SNAKE_SHAPES[:3]:
        st.check_snake("cpu", sm90.BF16, 1, c, length)
    sm90.codec_launches(2)
    assert len(compile_only) >= 10


def test_predictor_pass_compiles(compile_only):
    """The persistent pass at the 0.6B predictor's shapes, with its L2 prefetch (inline PTX, which the
    interpreter skips), at 1, 4 and 16 rows in bf16 and at 1 row in fp32 (the exact path)."""
    for m in ROWS:
        sm90.predictor_pass_launches(m)
    sm90.predictor_pass_launches(1, torch.float32)
    assert len(compile_only) >= 3
