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

import math
import numbers

import torch

from . import checks
from .errors import InvalidInputError, VoiceError
from .voice import Voice

MIN_VOICES, MAX_VOICES = 2, 4
MIN_WEIGHT_SUM = 1e-3  # weights are relative, but a sum this small is all zero in all but name


def _shares(weights, names: list[str]) -> list[float]:
    """Every weight's share of their sum. Each weight is a finite number >= 0 and the sum is at least
    MIN_WEIGHT_SUM, so no weight set (all zero, vanishing, NaN, infinite) can make the mix NaN."""
    for name, x in zip(names, weights):
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not (math.isfinite(x) and x >= 0):
            raise InvalidInputError(f"the weight of {name} must be a finite number, 0 or more (got {x!r}).")
    w = [float(x) for x in weights]
    if not sum(w) >= MIN_WEIGHT_SUM:  # a sum of huge weights may be inf: still a valid ratio
        raise InvalidInputError(f"the weights add up to {sum(w):g}; they must add up to at least {MIN_WEIGHT_SUM:g} "
                                "(they are relative: 1 and 3 give 25 % and 75 %). Raise a weight.")
    scaled = [x / max(w) for x in w]  # in (0, 1]: no overflow
    return [x / sum(scaled) for x in scaled]


def blend_voices(voices: list[Voice], weights: list[float], labels: list[str] | None = None) -> Voice:
    """The weighted x-vector blend of `voices` (weights >= 0, any scale), as a voice of the same model.
    `labels` name the voices in errors (default "voice 1", "voice 2", ...)."""
    if not MIN_VOICES <= len(voices) <= MAX_VOICES:
        raise InvalidInputError(f"blend {MIN_VOICES} to {MAX_VOICES} voices (got {len(voices)}).")
    if len(weights) != len(voices):
        raise InvalidInputError(f"{len(voices)} voices but {len(weights)} weights.")
    names = list(labels) if labels else [f"voice {i}" for i in range(1, len(voices) + 1)]
    for name, v in zip(names, voices):
        if not checks.same_kind(v, Voice):
            raise InvalidInputError(f"{name} must be an engine Voice (got {type(v).__name__}).")
        v.check_contents(name)  # a NaN embedding would make a NaN blend
    shares = _shares(weights, names)
    first = voices[0]
    for name, v in zip(names[1:], voices[1:]):
        if v.family != first.family or v.model_size != first.model_size or v.width != first.width:
            raise VoiceError(
                f"{name} was made by a {v.family} {v.model_size or '?'} model (width {v.width}) but {names[0]} by a "
                f"{first.family} {first.model_size or '?'} model (width {first.width}). Only voices of the same "
                "model family and size can be blended: extract them all with one Base model.")
    embs = torch.stack([v.spk_embedding.detach().to("cpu", torch.float32).reshape(-1) for v in voices])
    wt = torch.tensor(shares, dtype=torch.float32)
    mix = (wt[:, None] * embs).sum(0)
    target = (wt * embs.norm(dim=1)).sum()
    norm = mix.norm()
    if not norm > 1e-6 * max(float(target), 1e-12):
        raise InvalidInputError("the weighted voices cancel each other out; change the weights.")
    mix = mix * (target / norm)
    if not bool(torch.isfinite(mix).all()):  # never a NaN voice, whatever got through
        raise InvalidInputError("the blend is not a finite vector (a voice holds huge values); blend other voices.")
    return Voice(spk_embedding=mix.to(first.spk_embedding.dtype), model_size=first.model_size, family=first.family)
