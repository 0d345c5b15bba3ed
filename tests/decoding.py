"""Helpers shared by the decode tests (CPU and GPU)."""
from __future__ import annotations

import torch

from engine.decode import collect, decode_frames


def decode_codes(engine, runner, req, takes, params, seed=0, take_offset=0):
    """(codes [takes, frames, 16], lengths) of `req` decoded by any frame runner, with the engine's own prompt,
    frame budget and EOS id: how the engine itself decodes, but with the runner under test."""
    prompt, params, frames = engine._prepare(req, takes, params)
    return collect(decode_frames(runner, prompt, takes=takes, seed=seed, params=params, max_frames=frames,
                                 eos_id=engine.cfg.talker.codec_eos_id, take_offset=take_offset))


def joined_take(chunks, i: int) -> torch.Tensor:
    """Take i's audio from streamed chunks, each chunk trimmed to its valid samples."""
    return torch.cat([c.audio[i, : c.valid[i]] for c in chunks])
