"""Blend 2-4 voices into one by mixing their speaker embeddings (x-vectors).

Only the x-vectors mix. An ICL voice also carries reference codec codes and their transcript: one real
recording, which the talker continues as left context. Codes are discrete ids of one recording; an
average of them is no recording at all, and keeping one voice's reference would let that voice dominate
the prosody and timbre whatever its weight. So an ICL voice contributes its x-vector and the blend is
always an x-vector voice (the BlendVoices node says which inputs were ICL).

The mix is the weighted mean of the embeddings, scaled back to the weighted mean of their norms: the raw
x-vectors are not normalised, and a plain mean of different directions is shorter than any of them,
outside what the talker saw in training.
"""
from __future__ import annotations

import torch

from .errors import InvalidInputError, VoiceError
from .voice import Voice

MIN_VOICES, MAX_VOICES = 2, 4


def blend_voices(voices: list[Voice], weights: list[float], labels: list[str] | None = None) -> Voice:
    """The weighted x-vector blend of `voices` (weights >= 0, any scale), as a voice of the same model.
    `labels` name the voices in errors (default "voice 1", "voice 2", ...)."""
    if not MIN_VOICES <= len(voices) <= MAX_VOICES:
        raise InvalidInputError(f"blend {MIN_VOICES} to {MAX_VOICES} voices (got {len(voices)}).")
    if len(weights) != len(voices):
        raise InvalidInputError(f"{len(voices)} voices but {len(weights)} weights.")
    w = [float(x) for x in weights]
    if any(not x >= 0 for x in w) or sum(w) <= 0:
        raise InvalidInputError(f"weights must be 0 or more and not all 0 (got {w}).")
    names = list(labels) if labels else [f"voice {i}" for i in range(1, len(voices) + 1)]
    first = voices[0]
    for name, v in zip(names[1:], voices[1:]):
        if v.family != first.family or v.model_size != first.model_size or v.width != first.width:
            raise VoiceError(
                f"{name} was made by a {v.family} {v.model_size or '?'} model (width {v.width}) but {names[0]} by a "
                f"{first.family} {first.model_size or '?'} model (width {first.width}). Only voices of the same "
                "model family and size can be blended: extract them all with one Base model.")
    embs = torch.stack([v.spk_embedding.detach().to("cpu", torch.float32).reshape(-1) for v in voices])
    wt = torch.tensor(w, dtype=torch.float32) / sum(w)
    mix = (wt[:, None] * embs).sum(0)
    target = (wt * embs.norm(dim=1)).sum()
    norm = mix.norm()
    if norm <= 1e-6 * max(float(target), 1e-12):
        raise InvalidInputError("the weighted voices cancel each other out; change the weights.")
    mix = mix * (target / norm)
    return Voice(spk_embedding=mix.to(first.spk_embedding.dtype), model_size=first.model_size, family=first.family)
