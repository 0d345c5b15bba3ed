"""Batch buckets: the row counts that frame graphs and codec piece graphs are captured for. A run of fewer
rows than its bucket pads the rest (a padding row is finished from the start; a zero codec row changes no
other row)."""
from __future__ import annotations

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def batch_bucket(rows: int) -> int:
    """The smallest bucket that holds `rows` rows."""
    for b in BATCH_BUCKETS:
        if b >= rows:
            return b
    raise ValueError(f"at most {BATCH_BUCKETS[-1]} rows fit a graph bucket (got {rows})")


def warm_buckets(warm_takes: int) -> list:
    """The batch buckets whose graphs a load captures: one take's, and that of warm_takes rows."""
    return sorted({1, batch_bucket(warm_takes)})


def bucket_for(rows: int, captured, warm) -> int:
    """The bucket a run of `rows` rows uses: its own if its graphs exist (`captured`), else the smallest of the
    buckets the load captured (`warm`) that holds the rows, so the request waits for no capture; else its own,
    captured before the run starts. Only the load's buckets stand in: a larger bucket that a request captured
    is no default for smaller runs (a larger bucket's frame costs more than the rows' own)."""
    own = batch_bucket(rows)
    if own in captured:
        return own
    larger = [b for b in warm if b >= rows]
    return min(larger) if larger else own
