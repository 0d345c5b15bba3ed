"""GPU tests (skipped without CUDA by tests/conftest.py)."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def no_tf32():
    """fp32 comparisons need true fp32: TF32 convolutions alone move the codec output by ~1e-2."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
