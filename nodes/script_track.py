"""Lay the lines of a script out on one track: silences between them, pauses where the script says
(torch only, no ComfyUI).

Between two lines goes `gap_ms` of silence, unless the script has pause tags there: then exactly their
sum. Pauses before the first line or after the last one become leading or trailing silence. Silences
are whole milliseconds, so at 24 kHz (and any rate that is a multiple of 1000) every line starts and ends
on a whole millisecond when its length is one too (codec frames are 80 ms), and the SRT times are exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .script_parse import Pause, Utterance


@dataclass
class Track:
    waveform: torch.Tensor  # [samples] float32
    spans: list[tuple[int, int]]  # (start, end) sample of every line in the track, in script order


def ms_to_samples(ms: int, sample_rate: int) -> int:
    return int(ms) * int(sample_rate) // 1000


def assemble(events: list[Utterance | Pause], clips: list[torch.Tensor], sample_rate: int,
             gap_ms: int) -> Track:
    """`clips` holds one 1-D waveform per utterance of `events`, in order."""
    n_lines = sum(isinstance(e, Utterance) for e in events)
    if len(clips) != n_lines:
        raise ValueError(f"{len(clips)} clips for {n_lines} lines")
    parts, spans, pos = [], [], 0
    pause_ms, spoken = None, 0  # pause_ms: pauses since the last line (None: none)

    def silence(ms: int) -> None:
        nonlocal pos
        n = ms_to_samples(ms, sample_rate)
        parts.append(torch.zeros(n))
        pos += n

    for e in events:
        if isinstance(e, Pause):
            pause_ms = (pause_ms or 0) + e.ms
            continue
        if pause_ms is not None:
            silence(pause_ms)
        elif spoken:
            silence(gap_ms)
        clip = clips[spoken].reshape(-1).to(torch.float32)
        parts.append(clip)
        spans.append((pos, pos + clip.numel()))
        pos += clip.numel()
        pause_ms, spoken = None, spoken + 1
    if pause_ms is not None:
        silence(pause_ms)
    return Track(torch.cat(parts) if parts else torch.zeros(0), spans)
