"""Limits shared by the engine, the CLI and the nodes, defined once (light: no torch)."""

MAX_TAKES = 16  # takes of one request (a node's takes, the CLI's --takes, a server request's takes)
MAX_ROWS = 64  # rows one decode loop holds (a server's requests together): the largest graph bucket (gpu/buckets.py)
SEED_MAX = (1 << 64) - 1  # seeds use all 64 bits
TAKE_STREAMS = 1 << 32  # take indices a random stream tells apart: first_take + takes <= 2^32
