"""Robustness tests: bad input, fuzzing, soak, interrupts, concurrency, static checks, voice save. They run with
one torch thread; most record their figures with the `figure` fixture (both fixtures in tests/conftest.py)."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    yield
