"""Split long text into segments at sentence boundaries (pure Python, no ComfyUI, no torch).

A segment is measured in "units": one per character, except CJK characters, which count
`CJK_WEIGHT` each because they are spoken more slowly per character (≈4-5 per second against ≈15 Latin
characters per second). Sentences are packed greedily into segments of at most `max_units`; a sentence
longer than that is cut at clause punctuation, then at spaces, and only as a last resort mid-word.

Splitting is linear in the text, and interruptible: `split_text` calls its `check` every CHECK_EVERY pieces
(the nodes pass ComfyUI's interrupt check), so a cancel reaches even a split of megabytes of text.
"""
from __future__ import annotations

import re
from collections.abc import Callable

CJK_WEIGHT = 3
FRAMES_PER_UNIT = 1.2  # generous upper bound of codec frames (12.5/s) per unit of text
DEFAULT_MAX_UNITS = 400  # about 30 s of English speech per segment
PROMPT_OVERHEAD = 64  # prompt positions besides the text: chat template and control tokens
CHECK_EVERY = 256  # pieces (sentences, clauses, cuts) between two interrupt checks: well under a millisecond

# A sentence ends at end punctuation plus any closing quotes or brackets (which stay with it). Only the
# whitespace after it is dropped: Latin needs some, CJK none; line breaks separate sentences too.
_SENTENCE_END = re.compile(
    r"[.!?…][\"'”’)\]]*(?P<gap>\s+)"
    r"|[。！？；][\"'”’」』)\]]*(?P<cjk>)"
    r"|(?P<lines>\n\s*\n?)"
)
_CLAUSE_END = re.compile(r"(?<=[,;:，、；：—])\s*")


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF)


def text_units(text: str) -> int:
    """Length of `text` in units (CJK characters weigh CJK_WEIGHT)."""
    return sum(CJK_WEIGHT if _is_cjk(c) else 1 for c in text)


def segment_budget(max_units: int, max_seq_len: int, prompt_overhead: int = PROMPT_OVERHEAD) -> int:
    """Largest segment (in units) whose prompt and audio fit the static KV cache of `max_seq_len`.

    `prompt_overhead` covers the chat template, control tokens and any reference codes (ICL). The text
    occupies at most one cache position per unit and its audio about FRAMES_PER_UNIT frames per unit.
    `max_new_tokens` is deliberately not used: it stays a per-segment safety cap, not a splitting rule.
    """
    by_cache = int((max_seq_len - prompt_overhead) / (FRAMES_PER_UNIT + 1.0))
    return max(1, min(max_units, by_cache))


class _Ticker:
    """Calls `check` once every CHECK_EVERY ticks; `check` raises to stop the split (None: never stops)."""

    def __init__(self, check: Callable[[], None] | None):
        self.check, self.count = check, 0

    def __call__(self) -> None:
        self.count += 1
        if self.check is not None and self.count % CHECK_EVERY == 0:
            self.check()


def _pieces(text: str, pattern: re.Pattern) -> list[str]:
    return [p.strip() for p in pattern.split(text) if p and p.strip()]


def _sentences(text: str, tick: _Ticker) -> list[str]:
    pieces, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        tick()
        cut = m.start("gap") if m.group("gap") is not None else m.end() if m.group("cjk") is not None else m.start()
        pieces.append(text[start:cut])
        start = m.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p.strip()]


def _unit(ch: str) -> int:
    return CJK_WEIGHT if _is_cjk(ch) else 1


def _hard_cut(piece: str, max_units: int, tick: _Ticker) -> list[str]:
    """Cut at spaces where possible, else between characters, so that every part fits. Linear in the piece:
    every character's units are counted once, and a word longer than the budget is cut by index, not by
    re-measuring what is left of it."""
    out, cur, cur_units = [], [], 0
    for word in re.finditer(r"\S+\s*|\s+", piece):
        word = word.group()
        tick()
        units = text_units(word)
        if cur_units + units <= max_units:
            cur.append(word)
            cur_units += units
            continue
        if "".join(cur).strip():
            out.append("".join(cur).strip())
        start = 0
        while units > max_units:  # a single word longer than the budget: its longest head that fits (one char at least)
            end, used = start + 1, _unit(word[start])
            while end < len(word) and used + _unit(word[end]) <= max_units:
                used += _unit(word[end])
                end += 1
            out.append(word[start:end].strip())
            tick()
            units -= used
            start = end
        cur, cur_units = [word[start:]], units
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return [p for p in out if p]


def _pack(parts: list[str], max_units: int, tick: _Ticker) -> list[str]:
    """Greedily join consecutive parts while the result stays within `max_units`. Units add up, so every part
    is measured once (re-measuring the growing segment made many short clauses cost n x max_units)."""
    segments, cur, cur_units = [], [], 0
    for part in parts:
        tick()
        units = text_units(part)
        joiner = _joiner(cur[-1], part) if cur else ""
        if cur and cur_units + len(joiner) + units <= max_units:  # a joiner is "" or one space: one unit
            cur += [joiner, part]
            cur_units += len(joiner) + units
            continue
        if cur:
            segments.append("".join(cur))
        cur, cur_units = [part], units
    if cur:
        segments.append("".join(cur))
    return segments


def _joiner(a: str, b: str) -> str:
    return "" if (a and _is_cjk(a[-1])) or (b and _is_cjk(b[0])) or (a and not a[-1].isascii()) else " "


def split_text(text: str, max_units: int = DEFAULT_MAX_UNITS, check: Callable[[], None] | None = None) -> list[str]:
    """Split `text` into segments of at most `max_units` units, at sentence boundaries if possible.

    Text that fits is returned unchanged as a single segment (only stripped). Empty text gives [].
    `check()` is called every CHECK_EVERY pieces; whatever it raises (ComfyUI's interrupt) ends the split.
    """
    if max_units < 1:
        raise ValueError("max_units must be at least 1")
    text = text.strip()
    if not text:
        return []
    if text_units(text) <= max_units:
        return [text]
    tick = _Ticker(check)
    parts: list[str] = []
    for sentence in _sentences(text, tick):
        if text_units(sentence) <= max_units:
            parts.append(sentence)
            continue
        for clause in _pack(_pieces(sentence, _CLAUSE_END), max_units, tick):
            parts.extend([clause] if text_units(clause) <= max_units else _hard_cut(clause, max_units, tick))
    return _pack(parts, max_units, tick)
