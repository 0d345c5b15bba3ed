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


def test_linear_fits_shared_memory_at_32_and_64_rows(compile_only):
    """A server's 64-row bucket in bf16, and 32 rows in the GPU tests' fp32: the plan's three pipeline stages
    of a [64 rows, 2 x 256] SwiGLU tile need 256 KB of shared memory (an fp32 one at 32 rows 288 KB), more than
    an H100 has, and such a launch is refused before it runs. Each runs with the stages that fit instead."""
    import torch

    from engine.kernels import linear
    from tests.support import kernels_selftest as st

    linear._STAGES.clear()
    shapes = [(1024, 3072, "silu_mul", True, False), (2048, 1024, "rms_norm", False, False),
              (2048, 6144, "silu_mul", True, False)]  # 0.6B down, a normed swapped tile, 1.7B down (SwiGLU in torch)
    for m, dtype in ((64, sm90.BF16), (32, torch.float32)):  # fp32 at 64 rows compiles for minutes here
        for shape in shapes:
            st.check_linear("cpu", dtype, m, *shape)
    fitted = {(key[1], key[2], key[3], key[4]): stages for key, stages in linear._STAGES.items()}
    assert fitted[(torch.bfloat16, 64, 1024, 3072)] == 2  # the 0.6B's (and 1.7B predictor's) down_proj
    assert fitted[(torch.float32, 32, 1024, 3072)] == 2
    assert all(key[2] >= 32 for key in linear._STAGES)  # 16-row tiles fit as planned


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

