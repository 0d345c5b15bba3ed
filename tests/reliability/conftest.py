"""Reliability suite (issue 13): every test records its figures with the `figure` fixture; they are printed
together at the end of the run (also without -s), so CI logs always show them."""
from __future__ import annotations

import json

import pytest

_FIGURES: list[tuple[str, dict]] = []


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny checkpoints are overhead-bound: one intra-op thread is as fast and keeps these long runs from
    oversubscribing a busy 2-core CI machine (measured: the interrupt test took 13 s CPU with one thread,
    193 s with two on a loaded machine)."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def figure(request):
    """figure(**values): record (and print) this test's measured figures."""
    def record(**values):
        _FIGURES.append((request.node.nodeid.split("::", 1)[-1], values))
        print(json.dumps(values, default=str))
    return record


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for name, values in _FIGURES:
        terminalreporter.write_line(f"{name}: {json.dumps(values, default=str)}")
