"""SubRip (.srt) subtitles from sample spans (pure Python)."""
from __future__ import annotations


def timestamp(sample: int, sample_rate: int) -> str:
    """`HH:MM:SS,mmm` of a sample offset, rounded to the nearest millisecond."""
    ms = (int(sample) * 1000 * 2 + int(sample_rate)) // (2 * int(sample_rate))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def to_srt(cues: list[tuple[int, int, str]], sample_rate: int) -> str:
    """One numbered cue per (start sample, end sample, text); text keeps no blank lines (they end a cue)."""
    blocks = []
    for i, (start, end, text) in enumerate(cues, start=1):
        body = "\n".join(line for line in str(text).splitlines() if line.strip()) or "..."
        blocks.append(f"{i}\n{timestamp(start, sample_rate)} --> {timestamp(end, sample_rate)}\n{body}\n")
    return "\n".join(blocks)
