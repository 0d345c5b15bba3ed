"""Helpers shared by the decode tests (CPU and GPU)."""
from __future__ import annotations

import torch

from engine import sampling
from engine.decode import Row, decode_rows


def decode_frames(runner, prompt, *, takes, seed, params, max_frames, eos_id, first_take=0, **loop):
    """`takes` takes of one prompt (take i draws from stream (seed, first_take + i)), all admitted at once:
    the decode loop as Engine.generate runs it for one request."""
    keys = sampling.take_keys(seed, range(first_take, first_take + takes), "cpu").tolist()
    rows = [Row(prompt, k, max_frames) for k in keys]
    return decode_rows(runner, rows, slots=takes, params=params, eos_id=eos_id, **loop)


def collect(chunks):
    """Concatenate the loop's chunks into codes [B, T, 16] and per-take frame counts (frames before EOS)."""
    codes, valid = [], []
    for c in chunks:
        codes.append(c.codes)
        valid.append(c.valid)
    lengths = torch.cat(valid, 1).sum(1).tolist()
    return torch.cat(codes, 1), [int(n) for n in lengths]


def decode_codes(engine, runner, req, takes, params, seed=0, first_take=0):
    """(codes [takes, frames, 16], lengths) of `req` decoded by any frame runner, with the engine's own prompt,
    frame budget and EOS id: how the engine itself decodes, but with the runner under test."""
    prompt, params, frames = engine.prepare(req, takes, params)
    return collect(decode_frames(runner, prompt, takes=takes, seed=seed, params=params, max_frames=frames,
                                 eos_id=engine.cfg.talker.codec_eos_id, first_take=first_take))


def joined_take(chunks, i: int) -> torch.Tensor:
    """Take i's audio, joined from Engine.stream's chunks."""
    return torch.cat([c.audio for c in chunks if c.take == i])


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
