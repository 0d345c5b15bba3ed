"""Shared by the benches: the best of several timed runs."""
from __future__ import annotations


def best_of(run, n: int = 3, key=None):
    """Call run(rep) for rep in 0..n-1 and return the result that is smallest by `key` (the first on ties)."""
    return min((run(rep) for rep in range(n)), key=key)
