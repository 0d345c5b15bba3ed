"""Lay the lines of a script out on one track: silences between them, pauses where the script says
(torch only, no ComfyUI).

Between two lines goes `gap_ms` of silence, unless the script has pause tags there: then exactly their
sum. Pauses before the first line or after the last one become leading or trailing silence. All the silence
together is capped (MAX_TOTAL_SILENCE_MS), checked before anything is generated. Silences
are whole milliseconds, so at 24 kHz (and any rate that is a multiple of 1000) every line starts and ends
on a whole millisecond when its length is one too (codec frames are 80 ms), and the SRT times are exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .script_parse import Pause, ScriptError, Utterance

MAX_TOTAL_SILENCE_MS = 20 * 60_000  # all pauses and line gaps of one script: 20 minutes (a pause alone: 10)


@dataclass
class Track:
    waveform: torch.Tensor  # [samples] float32
    spans: list[tuple[int, int]]  # (start, end) sample of every line in the track, in script order


def ms_to_samples(ms: int, sample_rate: int) -> int:
    return int(ms) * int(sample_rate) // 1000


def _layout(events: list[Utterance | Pause], gap_ms: int):
    """The track in order: ("silence", ms) and ("line", index of the utterance) items."""
    pause_ms, spoken = None, 0  # pause_ms: pauses since the last line (None: none)
    for e in events:
        if isinstance(e, Pause):
            pause_ms = (pause_ms or 0) + e.ms
            continue
        if pause_ms is not None:
            yield "silence", pause_ms
        elif spoken:
            yield "silence", gap_ms
        yield "line", spoken
        pause_ms, spoken = None, spoken + 1
    if pause_ms is not None:
        yield "silence", pause_ms


def total_silence_ms(events: list[Utterance | Pause], gap_ms: int) -> int:
    """The silence the script adds to its lines: its pauses and the line gaps where no pause stands."""
    return sum(value for kind, value in _layout(events, gap_ms) if kind == "silence")


def check_silence(events: list[Utterance | Pause], gap_ms: int) -> None:
    """Raise ScriptError when the pauses and line gaps add more than MAX_TOTAL_SILENCE_MS in all (each pause is
    capped on its own too): a track is held in memory, and that much silence is a typo, not a pause."""
    total = total_silence_ms(events, gap_ms)
    if total > MAX_TOTAL_SILENCE_MS:
        raise ScriptError(f"the [pause] tags and line_gap ({gap_ms / 1000:g} s) add {total / 1000:g} s of silence "
                          f"in all; a script may add at most {MAX_TOTAL_SILENCE_MS // 60_000} minutes "
                          f"({MAX_TOTAL_SILENCE_MS // 1000} s). Shorten the pauses or line_gap, or split the script.")


def assemble(events: list[Utterance | Pause], clips: list[torch.Tensor], sample_rate: int,
             gap_ms: int) -> Track:
    """`clips` holds one 1-D waveform per utterance of `events`, in order."""
    n_lines = sum(isinstance(e, Utterance) for e in events)
    if len(clips) != n_lines:
        raise ValueError(f"{len(clips)} clips for {n_lines} lines")
    parts, spans, pos = [], [], 0
    for kind, value in _layout(events, gap_ms):
        if kind == "silence":
            n = ms_to_samples(value, sample_rate)
            parts.append(torch.zeros(n))
            pos += n
            continue
        clip = clips[value].reshape(-1).to(torch.float32)
        parts.append(clip)
        spans.append((pos, pos + clip.numel()))
        pos += clip.numel()
    return Track(torch.cat(parts) if parts else torch.zeros(0), spans)
