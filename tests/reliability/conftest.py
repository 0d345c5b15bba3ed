"""Reliability suite (issue 13): every test records its figures with the `figure` fixture; they are printed
together at the end of the run (also without -s), so CI logs always show them."""
from __future__ import annotations

import json

import pytest

_FIGURES: list[tuple[str, dict]] = []


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
