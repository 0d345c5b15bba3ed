"""Dialogue scripts and voice tables as text (pure Python, no ComfyUI, no torch).

A script has one event per line:

    Alice: Good morning, Bob.              an utterance: `Name: text`
    Bob [sleepy, slow]: Is it morning?     an utterance with its own instruction in square brackets
    [pause 0.8s]                           a pause (also `[pause 800ms]`), on its own line

Blank lines and lines starting with `#` are skipped; anything else that does not fit raises ScriptError
naming the line. The voice table maps names to voices, one `Name = value` per line (see script_cast.py for
what the value may be on each model type). Names match case-insensitively.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PAUSE_MS = 600_000  # ten minutes: anything longer is a typo
_PAUSE = re.compile(r"\[\s*pause\s+(\d+(?:\.\d+)?)\s*(ms|s)\s*\]", re.IGNORECASE)
_NAME_PART = re.compile(r"[^:\[\]]*")  # greedy, one pass: a lazy name before optional blanks was cubic
_NAME = re.compile(r"\w[\w .'-]*", re.UNICODE)


class ScriptError(ValueError):
    """A script or voice-table line that cannot be read; the message names the line and the fix."""


@dataclass(frozen=True)
class Utterance:
    line: int  # 1-based line number in the script
    name: str
    text: str
    instruct: str = ""

    @property
    def key(self) -> str:
        return name_key(self.name)


@dataclass(frozen=True)
class Pause:
    line: int
    ms: int


@dataclass(frozen=True)
class CastEntry:
    line: int  # 1-based line number in the voice table
    name: str
    value: str


def name_key(name: str) -> str:
    return " ".join(name.split()).casefold()


def _content_lines(text: str):
    for no, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield no, line


def _pause(no: int, line: str) -> Pause:
    m = _PAUSE.fullmatch(line)
    if m is None:
        raise ScriptError(f"script line {no}: malformed tag {line!r}. A pause is written [pause 0.8s] or "
                          "[pause 800ms] on its own line; an instruction goes between the name and the colon: "
                          "'Name [whispering]: text'.")
    value, unit = float(m.group(1)), m.group(2).lower()
    ms = round(value * 1000) if unit == "s" else round(value)
    if not 0 < ms <= MAX_PAUSE_MS:
        raise ScriptError(f"script line {no}: pause {line!r} must be longer than 0 and at most "
                          f"{MAX_PAUSE_MS // 1000} s.")
    return Pause(no, ms)


def _split_utterance(line: str) -> tuple[str, str | None, str] | None:
    """(name, instruction or None, text) of `Name: text` or `Name [instruction]: text`, else None. Each part is
    found by one scan, so any line takes time linear in its length."""
    end = _NAME_PART.match(line).end()
    name, rest, instruct = line[:end], line[end:], None
    if not name or not rest:
        return None
    if rest[0] == "[":
        close = rest.find("]")
        if close < 0 or "[" in rest[1:close]:
            return None
        instruct, rest = rest[1:close], rest[close + 1:].lstrip()
    if not rest.startswith(":"):
        return None
    return name, instruct, rest[1:]


def _utterance(no: int, line: str) -> Utterance:
    parts = _split_utterance(line)
    if parts is None:
        raise ScriptError(f"script line {no}: expected 'Name: text' (or 'Name [instruction]: text'), got {line!r}.")
    name, instruct, text = parts[0].strip(), parts[1], parts[2].strip()
    if not _NAME.fullmatch(name):
        raise ScriptError(f"script line {no}: {name!r} is not a usable name; names are letters, digits, spaces "
                          "and _ . ' - (e.g. 'Alice: Hello.').")
    if instruct is not None and not instruct.strip():
        raise ScriptError(f"script line {no}: empty instruction '[]' after {name!r}; write one or remove the brackets.")
    if not text:
        raise ScriptError(f"script line {no}: {name!r} has no text to speak; write the words after the colon "
                          "or delete the line.")
    if "[" in text or "]" in text:
        raise ScriptError(f"script line {no}: a tag inside the text ({text!r}). Pauses go on their own line "
                          "([pause 0.8s]); an instruction goes before the colon: 'Name [whispering]: text'.")
    return Utterance(no, " ".join(name.split()), text, (instruct or "").strip())


def parse_script(text: str) -> list[Utterance | Pause]:
    """Every utterance and pause of the script, in order. Raises ScriptError naming the first bad line."""
    events: list[Utterance | Pause] = []
    for no, line in _content_lines(text):
        events.append(_pause(no, line) if line.startswith("[") else _utterance(no, line))
    if not any(isinstance(e, Utterance) for e in events):
        raise ScriptError("the script has no lines to speak; write one 'Name: text' per line.")
    return events


def parse_cast(text: str) -> dict[str, CastEntry]:
    """The voice table as {name key: entry}. Raises ScriptError naming the first bad line."""
    cast: dict[str, CastEntry] = {}
    for no, line in _content_lines(text):
        name, sep, value = line.partition("=")
        name, value = " ".join(name.split()), value.strip()
        if not sep or not name or not value:
            raise ScriptError(f"voices line {no}: expected 'Name = voice' (a preset speaker, voice_1..voice_4 "
                              f"or a voice description), got {line!r}.")
        if not _NAME.fullmatch(name):
            raise ScriptError(f"voices line {no}: {name!r} is not a usable name (letters, digits, spaces, _ . ' -).")
        if name_key(name) in cast:
            raise ScriptError(f"voices line {no}: {name!r} is already given a voice on line "
                              f"{cast[name_key(name)].line}; keep one.")
        cast[name_key(name)] = CastEntry(no, name, value)
    if not cast:
        raise ScriptError("the voices table is empty; give every name of the script a voice, one "
                          "'Name = voice' per line.")
    return cast


def check_names(events: list[Utterance | Pause], cast: dict[str, CastEntry]) -> None:
    """Raise ScriptError for the first utterance whose name the voice table does not have."""
    for e in events:
        if isinstance(e, Utterance) and e.key not in cast:
            known = ", ".join(c.name for c in cast.values())
            raise ScriptError(f"script line {e.line}: unknown name {e.name!r}; the voices table has {known}. "
                              f"Add '{e.name} = ...' to the voices table or fix the name.")
