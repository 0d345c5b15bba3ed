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


def oracle_greedy(model, method: str, frames: int, **kwargs):
    """Call an official qwen-tts generate_* method greedily for `frames` frames (its max_new_tokens = N yields
    N - 1 frames); return (the code tensors [frames(+ICL reference), 16] it hands its codec, its wavs)."""
    seen = []
    tokenizer = model.model.speech_tokenizer
    original = tokenizer.decode

    def capture(items, *a, **k):
        seen.extend(item["audio_codes"].clone() for item in items)
        return original(items, *a, **k)

    tokenizer.decode = capture
    try:
        wavs, sr = getattr(model, method)(do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1,
                                          **kwargs)
    finally:
        tokenizer.decode = original
    assert sr == 24000
    return seen, wavs
