"""Argument checks shared by the engine's entry points (generate, stream, extract_voice, sampling settings).

Every caller (the Python API, the CLI, the ComfyUI nodes) reaches the engine with whatever its user typed,
so a wrong type or a NaN must become an InvalidInputError naming the argument and its valid range here,
never a TypeError or an OverflowError deep inside torch.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

from .errors import InvalidInputError


def integer(name: str, value, what: str = "a whole number") -> int:
    """`value` as an int. bool, floats (even 2.0) and NaN are refused: they are always a mistake."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(f"{name} must be {what} (got {value!r}).")
    return int(value)


def whole_number(name: str, value, lo: int, hi: int, hint: str = "") -> int:
    """`value` as an int in [lo, hi] (see `integer`)."""
    span = f"between {lo} and {hi}" if lo < hi else f"exactly {lo}"  # never "between 1 and 1"
    value = integer(name, value, f"a whole number {span}")
    if not lo <= value <= hi:
        raise InvalidInputError(f"{name} must be {span} (got {value}). {hint}".rstrip())
    return value


def real_number(name: str, value, lo: float, hi: float, *, lo_open: bool = False, hint: str = "") -> float:
    """`value` as a finite float in [lo, hi] (or (lo, hi] with lo_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputError(f"{name} must be a number (got {value!r}). {hint}".rstrip())
    value = float(value)
    low_ok = value > lo if lo_open else value >= lo
    if not (math.isfinite(value) and low_ok and value <= hi):
        span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise InvalidInputError(f"{name} must be a finite number in {span} (got {value!r}). {hint}".rstrip())
    return value


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name} must be True or False (got {value!r}).")
    return value


def text_value(name: str, value, optional: bool = False) -> str | None:
    """A str that UTF-8 can encode (no lone surrogates), or None when optional."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string (got {type(value).__name__}).")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{name} contains invalid Unicode ({exc.reason}: {value[exc.start]!r} at position {exc.start}); "
            "remove that character or re-encode the text as UTF-8."
        ) from exc
    return value


def has_visible(text: str) -> bool:
    """Whether `text` holds a character that shows: not a blank, a control, or an invisible format character
    (zero-width spaces and joiners, direction marks, the byte-order mark: Unicode's non-printable classes)."""
    return any(ch.isprintable() and not ch.isspace() for ch in text)


def visible_text(name: str, value: str, hint: str) -> str:
    """`value` unless it has no visible character (see has_visible): the one check for every text that is spoken
    or transcribes speech, so the same characters are refused the same way wherever they are typed."""
    if not has_visible(value):
        raise InvalidInputError(f"the {name} is empty (nothing but blanks, control or invisible characters); {hint}")
    return value


def same_kind(value, cls) -> bool:
    """isinstance, or the same dataclass loaded under another module name (ComfyUI imports the pack as a package
    named after its folder, so a test or a second pack may hold `engine.Request` next to `<pack>.engine.Request`)."""
    if isinstance(value, cls):
        return True
    kind = type(value)
    return (kind.__name__ == cls.__name__ and dataclasses.is_dataclass(kind)
            and [f.name for f in dataclasses.fields(kind)] == [f.name for f in dataclasses.fields(cls)])
