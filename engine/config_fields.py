"""Typed readers for the fields of a checkpoint's JSON configs (config.json, generation_config.json and
speech_tokenizer/config.json).

A config is data from disk: a hand edit, a converter or a damaged download can put any JSON value in any
field. Every value is checked here, before it sizes a module or indexes an embedding, so a wrong one ends in
a CheckpointError that names the file and the field and says what to do, never in a TypeError deep inside a
module or a device-side assert on CUDA.
"""
from __future__ import annotations

import math
import reprlib

from .errors import CheckpointError

# Generous bounds: far beyond every published checkpoint, small enough that no size overflows a tensor shape.
MAX_SIZE = 1 << 20  # widths, vocabularies, sequence lengths
MAX_COUNT = 1 << 10  # layers, heads, codebooks, list lengths
FIX = ("The file was edited or damaged: restore it from the original download (download the checkpoint "
       "again), or correct the field.")
_MISSING = object()

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 2, 40, 40, 4, 4


def shown(value) -> str:
    """A short repr of a config value: a deep or huge value must not flood (or overflow) the message."""
    return _short.repr(value)


def fail(where: str, key: str, what: str, value=_MISSING) -> CheckpointError:
    got = "" if value is _MISSING else f" (got {shown(value)})"
    return CheckpointError(f"{where}: field '{key}' must be {what}{got}. {FIX}")


def _get(d: dict, key: str, where: str, default):
    if key in d:
        return d[key]
    if default is _MISSING:
        raise CheckpointError(f"missing key '{key}' in {where}; the file is incomplete or not a Qwen3-TTS-12Hz "
                              f"config. {FIX}")
    return default


def is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def section(d: dict, key: str, where: str, default=_MISSING) -> dict:
    """A nested JSON object."""
    value = _get(d, key, where, default)
    if not isinstance(value, dict):
        raise fail(where, key, "a JSON object", value)
    return value


def whole(d: dict, key: str, where: str, lo: int = 1, hi: int = MAX_SIZE, default=_MISSING,
          null_default: bool = False) -> int:
    """An int in [lo, hi]; `null_default`: JSON null also means the default (fields upstream writes as null)."""
    value = _get(d, key, where, default)
    if value is None and null_default and default is not _MISSING:
        value = default
    if not is_whole(value) or not lo <= value <= hi:
        raise fail(where, key, f"a whole number between {lo} and {hi}", value)
    return value


def real(d: dict, key: str, where: str, lo: float, hi: float, *, lo_open: bool = False, default=_MISSING) -> float:
    """A finite number in [lo, hi] ((lo, hi] with lo_open)."""
    value = _get(d, key, where, default)
    if not is_real(value) or not math.isfinite(value) or not (lo < value if lo_open else lo <= value) \
            or value > hi:
        raise fail(where, key, f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]", value)
    return float(value)


def flag(d: dict, key: str, where: str, default=_MISSING) -> bool:
    value = _get(d, key, where, default)
    if not isinstance(value, bool):
        raise fail(where, key, "true or false", value)
    return value


def text(d: dict, key: str, where: str, choices: tuple = (), default=_MISSING) -> str:
    value = _get(d, key, where, default)
    if not isinstance(value, str) or (choices and value not in choices):
        raise fail(where, key, f"one of {', '.join(choices)}" if choices else "a string", value)
    return value


def whole_list(d: dict, key: str, where: str, lo: int = 1, hi: int = MAX_SIZE, length: int | None = None,
               default=_MISSING) -> tuple:
    """A non-empty list of ints in [lo, hi] (of exactly `length` items when given)."""
    value = _get(d, key, where, default)
    n = f"{length}" if length else f"1 to {MAX_COUNT}"
    what = f"a list of {n} whole numbers between {lo} and {hi}"
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_COUNT or \
            (length is not None and len(value) != length) or not all(is_whole(x) and lo <= x <= hi for x in value):
        raise fail(where, key, what, value)
    return tuple(value)


def id_map(d: dict, key: str, where: str, lo: int, hi: int) -> dict:
    """{lower-case name: id} from a JSON object of names to ids in [lo, hi); null or absent is empty."""
    value = _get(d, key, where, None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(where, key, "a JSON object of names to ids", value)
    out = {}
    for name, i in value.items():
        if not name.strip():
            raise fail(where, key, "an object whose names are not empty", name)
        if not is_whole(i) or not lo <= i < hi:
            raise fail(where, f"{key}.{name}", f"an id between {lo} and {hi - 1} (the embedding has {hi} rows)", i)
        out[name.lower()] = i
    return out


def token_id(d: dict, key: str, where: str, vocab: int, vocab_field: str) -> int:
    """An id that indexes an embedding of `vocab` rows (named `vocab_field` in the message)."""
    value = _get(d, key, where, _MISSING)
    if not is_whole(value) or not 0 <= value < vocab:
        raise fail(where, key, f"an id between 0 and {vocab - 1} ({vocab_field} is {vocab})", value)
    return value


def attention_shape(d: dict, where: str) -> tuple[int, int, int, int]:
    """(hidden_size, heads, kv_heads, head_dim) of a transformer section: kv heads divide the heads, and head_dim
    (default hidden // heads) is even, since rotary embeddings turn pairs of channels."""
    hidden = whole(d, "hidden_size", where)
    heads = whole(d, "num_attention_heads", where, hi=MAX_COUNT)
    kv_heads = whole(d, "num_key_value_heads", where, hi=MAX_COUNT)
    if heads % kv_heads:
        raise fail(where, "num_key_value_heads", f"a divisor of num_attention_heads ({heads})", kv_heads)
    head_dim = whole(d, "head_dim", where, default=hidden // heads, null_default=True)
    if head_dim % 2:
        raise fail(where, "head_dim", "an even number", head_dim)
    return hidden, heads, kv_heads, head_dim
