"""Who speaks how: the voice table resolved against the loaded model type (pure Python, no ComfyUI).

One script runs on one loaded model, so the table's values mean what that model can do:
* CustomVoice: a preset speaker (`Alice = Vivian`); a per-line [instruction] steers the line (1.7B).
* Base: a connected VOICE input (`Alice = voice_1`), x-vector or ICL; Base models take no instruction.
* VoiceDesign: a voice description (`Alice = A bright young woman, fast and cheerful.`); a per-line
  [instruction] is added to that line's description.
"""
from __future__ import annotations

import re

from .script_parse import CastEntry, ScriptError, Utterance

VOICE_SLOTS = ("voice_1", "voice_2", "voice_3", "voice_4")
_SLOT = re.compile(r"voice[ _]?(\d+)", re.IGNORECASE)


def _slot(value: str) -> str | None:
    m = _SLOT.fullmatch(value.strip())
    return f"voice_{m.group(1)}" if m else None


def _role(entry: CastEntry, model_type: str, speakers: list[str], voices: dict) -> dict:
    where = f"voices line {entry.line} ({entry.name} = {entry.value})"
    slot = _slot(entry.value)
    if model_type == "base":
        if slot is None or slot not in VOICE_SLOTS:
            raise ScriptError(f"{where}: on a Base model every name maps to a VOICE input, voice_1 .. voice_4 "
                              "(from ExtractSpeakerEmbedding, LoadVoice or BlendVoices).")
        if voices.get(slot) is None:
            raise ScriptError(f"{where}: {slot} is not connected; connect a VOICE to {slot}.")
        return {"mode": "clone", "voice": voices[slot]}
    if slot is not None:
        raise ScriptError(f"{where}: VOICE inputs need a Base checkpoint; on this model give a "
                          f"{'preset speaker' if model_type == 'custom_voice' else 'voice description'}.")
    if model_type == "custom_voice":
        match = {s.casefold(): s for s in speakers}.get(entry.value.casefold())
        if match is None:
            raise ScriptError(f"{where}: {entry.value!r} is not a preset speaker; choose one of "
                              f"{', '.join(speakers)}.")
        return {"mode": "custom", "speaker": match}
    if model_type == "voice_design":
        return {"mode": "design", "instruct": entry.value}
    raise ScriptError(f"unknown model type {model_type!r}")


def line_requests(utterances: list[Utterance], cast: dict[str, CastEntry], model_type: str,
                  speakers: list[str], voices: dict) -> list[dict]:
    """Request fields (mode, text, speaker / instruct / voice) for every utterance, in order."""
    roles = {key: _role(entry, model_type, speakers, voices) for key, entry in cast.items()}
    out = []
    for u in utterances:
        role = dict(roles[u.key])  # check_names ran first: every key is in the table
        if u.instruct:
            if role["mode"] == "clone":
                raise ScriptError(f"script line {u.line}: Base models take no instruction; remove "
                                  f"[{u.instruct}] or use a CustomVoice/VoiceDesign model.")
            role["instruct"] = f"{role['instruct']} {u.instruct}" if role.get("instruct") else u.instruct
        out.append({**role, "text": u.text})
    return out
