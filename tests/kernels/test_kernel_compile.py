"""Every Triton kernel the engine launches compiles for an H100 (sm_90) on a machine without a GPU.

The interpreter tests (test_kernels.py) run the kernels' Python; they cannot see what Triton's compiler
rejects (a branch it cannot fold, a helper's tuple, a layout it cannot build, a register budget). Triton's
wheel carries ptxas, so the whole compile to a cubin runs here. Here the launchers run as in
tests/support/kernels_selftest.py, at the 0.6B / 1.7B shapes in bf16 with PDL on, but each launch only compiles
(tests/support/sm90_compile.py; no result is checked)."""
import importlib.util

import pytest

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


def test_norm_rope_sample_snake_compile(compile_only):
    from tests.support import kernels_selftest as st

    for m in ROWS:
        sm90.small_launches(m)
    st.check_qk_norm_rope_kv_prefill("cpu", sm90.BF16, 5)
    for c, length in st.SNAKE_SHAPES[:3]:
        st.check_snake("cpu", sm90.BF16, 1, c, length)
    sm90.codec_launches(2)
    assert len(compile_only) >= 10

