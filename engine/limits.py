"""Limits shared by the engine, the CLI and the nodes, defined once (light: no torch)."""

MAX_TAKES = 16  # rows one call decodes at once: the largest batch bucket of the graphs (gpu/buckets.py)
SEED_MAX = (1 << 64) - 1  # seeds use all 64 bits
TAKE_STREAMS = 1 << 32  # take indices a random stream tells apart: first_take + takes <= 2^32
