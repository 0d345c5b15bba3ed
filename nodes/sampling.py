"""Advanced sampling widgets -> changes to the checkpoint's defaults (pure Python).

Every numeric widget uses -1 for "keep the checkpoint's generation_config.json value"; the two
on/off switches use the combo value "checkpoint". Only the values the user actually set are passed to
`SamplingParams.replace(**changes)`, so untouched widgets always follow the checkpoint.
"""
from __future__ import annotations

import math

DEFAULT = -1
SWITCH_OPTIONS = ["checkpoint", "sample", "greedy"]

# widget id -> (SamplingParams field, kind, min, max, tooltip)
NUMERIC = {
    "temperature": ("temperature", float, 0.0, 5.0, "Talker sampling temperature."),
    "top_k": ("top_k", int, 0, 3072, "Talker top-k (0 disables top-k)."),
    "top_p": ("top_p", float, 0.0, 1.0, "Talker nucleus sampling top-p."),
    "repetition_penalty": ("repetition_penalty", float, 0.5, 3.0, "Talker repetition penalty."),
    "sub_temperature": ("subtalker_temperature", float, 0.0, 5.0, "Code-predictor (sub-talker) temperature."),
    "sub_top_k": ("subtalker_top_k", int, 0, 2048, "Code-predictor (sub-talker) top-k."),
    "sub_top_p": ("subtalker_top_p", float, 0.0, 1.0, "Code-predictor (sub-talker) top-p."),
    "max_new_tokens": ("max_new_tokens", int, 1, 8192, "Maximum codec frames per segment (12.5 per second)."),
}
# Above their minimum, not at it, as the engine accepts them (0 is greedy's job: the do_sample switches).
OPEN_LOW = {"temperature", "top_p", "sub_temperature", "sub_top_p"}
SWITCHES = {
    "do_sample": ("do_sample", "Talker: sample, or greedy (argmax) decoding."),
    "sub_do_sample": ("subtalker_dosample", "Code predictor: sample, or greedy decoding."),
}


def sampling_changes(**widgets) -> dict:
    """Map widget values to SamplingParams field changes; unknown or default values are skipped.

    Raises ValueError naming the widget when a set value is out of its range.
    """
    changes = {}
    for wid, (field, _help) in SWITCHES.items():
        v = widgets.get(wid, "checkpoint")
        if v in (None, "checkpoint"):
            continue
        if v not in SWITCH_OPTIONS:
            raise ValueError(f"{wid} must be one of {SWITCH_OPTIONS}, got {v!r}")
        changes[field] = v == "sample"
    for wid, (field, kind, lo, hi, _help) in NUMERIC.items():
        v = widgets.get(wid, DEFAULT)
        if v is None or v == DEFAULT:
            continue
        whole = kind is int
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or (whole and v != int(v))):
            raise ValueError(f"{wid} must be a finite {'whole ' if whole else ''}number in [{lo}, {hi}], got {v!r} "
                             "(use -1 for the checkpoint default)")
        v = kind(v)
        if wid in OPEN_LOW and not lo < v <= hi:
            what = "1.0 disables nucleus sampling" if "top_p" in wid else "around 0.9 is typical"
            raise ValueError(f"{wid} must be in ({lo}, {hi}], got {v}: {what}; for deterministic output set the "
                             "do_sample switch to greedy instead of 0 (-1 uses the checkpoint default)")
        if not lo <= v <= hi:
            raise ValueError(f"{wid} must be in [{lo}, {hi}], got {v} (use -1 for the checkpoint default)")
        changes[field] = v
    return changes


def with_changes(defaults, changes: dict):
    """The checkpoint's SamplingParams with the widgets' changes. A max_new_tokens set below the checkpoint's
    min_new_tokens (which no widget sets) lowers that floor to it, instead of refusing a setting the user
    never saw."""
    params = defaults.replace(**changes)
    return params.capped(params.max_new_tokens) if "max_new_tokens" in changes else params
