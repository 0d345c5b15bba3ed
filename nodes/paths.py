"""Where checkpoints and voices live (pure Python; ComfyUI's folder_paths is passed in by the caller).

A Qwen3-TTS checkpoint is a DIRECTORY holding config.json. We own `models/qwen3_tts/` and only read
the folders other Qwen3-TTS packs use. Names shown in the loader are paths relative to their root
(posix separators); the first root that holds a name wins.
"""
from __future__ import annotations

import json
import os
import re
import unicodedata

FOLDER_KEY = "qwen3_tts"  # registered with folder_paths; extra_model_paths.yaml may add locations
VOICES_SUBDIR = "voices"
VOICE_EXT = ".safetensors"
# Read-only locations used by other packs, relative to the models directory.
FOREIGN_DIRS = ("Qwen3-TTS", "qwen-tts", "TTS/Qwen3-TTS", "TTS/qwen3_tts", "tts/Qwen3TTS")
# extra_model_paths.yaml keys other packs document; the values are their roots.
FOREIGN_KEYS = ("Qwen3-TTS", "qwen-tts", "qwen3tts", "Qwen3TTS")
MAX_DEPTH = 3
OFFICIAL_REPOS = (
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
)
_VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.\-]{0,99}$")


def candidate_roots(models_dir: str, own_paths: list[str], extra_paths: list[str]) -> list[str]:
    """Ordered, de-duplicated roots: ours (incl. extra_model_paths), then the other packs' folders."""
    roots = list(own_paths) + [os.path.join(models_dir, d) for d in FOREIGN_DIRS] + list(extra_paths)
    seen, out = set(), []
    for r in roots:
        key = os.path.realpath(r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def find_checkpoints(roots: list[str]) -> dict[str, str]:
    """{display name: absolute directory} for every directory with a config.json under the roots."""
    found: dict[str, str] = {}
    for root in roots:
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            rel = os.path.relpath(dirpath, root)
            depth = 0 if rel == "." else rel.count(os.sep) + 1
            # config.json of any kind marks a checkpoint: a damaged one (a directory, a FIFO) is listed so that
            # choosing it says what is wrong, and its own sub-folders never show up as checkpoints instead
            if ("config.json" in filenames or "config.json" in dirnames) and rel != ".":
                found.setdefault(rel.replace(os.sep, "/"), os.path.abspath(dirpath))
                dirnames[:] = []  # a checkpoint's own subfolders (speech_tokenizer/) are not checkpoints
                continue
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != VOICES_SUBDIR)
            if depth >= MAX_DEPTH:
                dirnames[:] = []
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


MAX_CONFIG_BYTES = 16 << 20  # a published config.json is a few kB; a larger "config" is not read at listing


def read_config(d: str) -> dict | None:
    """A folder's config.json as a JSON object, or None where it cannot be one: missing, not a regular file (a
    FIFO would block the listing), too large, unreadable, not JSON, nested too deeply or not an object. The
    node lists are built from every folder found, so one bad folder must never break them; loading that
    folder reports what is wrong with it."""
    path = os.path.join(d, "config.json")
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_CONFIG_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: the parser recurses once per nesting level
        return None
    return data if isinstance(data, dict) else None


def checkpoint_speakers(checkpoint_dirs) -> list[str]:
    """Speaker names of the CustomVoice checkpoints among the directories (`talker_config.spk_id` keys of their
    config.json, as written there), in order of first appearance. Configs that are unreadable, or whose speaker
    table is not names to ids of the talker's vocabulary (the load would refuse them), add none."""
    names: dict[str, None] = {}
    for d in checkpoint_dirs:
        cfg = read_config(d)
        if cfg is None or cfg.get("tts_model_type") != "custom_voice":
            continue
        talker = cfg.get("talker_config")
        spk = talker.get("spk_id") if isinstance(talker, dict) else None
        vocab = talker.get("vocab_size") if isinstance(talker, dict) else None
        if isinstance(spk, dict) and type(vocab) is int and all(type(i) is int and 0 <= i < vocab
                                                                 for i in spk.values()):
            names.update((k, None) for k in spk if k.strip())
    return list(names)


def _is_codec_folder(d: str) -> bool:
    """A standalone codec download (Qwen/Qwen3-TTS-Tokenizer-12Hz): its own config.json is the codec's."""
    cfg = read_config(d)
    return cfg is not None and cfg.get("model_type") == "qwen3_tts_tokenizer_12hz"


def codec_choices(found: dict[str, str]) -> list[str]:
    """Names of the found folders that carry a codec (speech_tokenizer/, or a standalone codec folder), for the
    loader's `codec` input."""
    return [name for name, d in found.items()
            if os.path.isfile(os.path.join(d, "speech_tokenizer", "config.json")) or _is_codec_folder(d)]


def clean_name(name: str) -> str:
    """A name as its file will be called: Unicode NFC, control and other invisible format characters removed,
    every run of whitespace one space, no space at either end. Two names that differ only in those ways are the
    same name, so they can never be two files that look alike (or overwrite each other unannounced)."""
    text = unicodedata.normalize("NFC", str(name))
    text = "".join(" " if ch.isspace() else ch for ch in text if ch.isspace() or unicodedata.category(ch)[0] != "C")
    return " ".join(text.split())


def check_voice_name(name: str) -> str:
    """Return the file name for a voice name (see clean_name), or raise ValueError saying what is allowed."""
    if not isinstance(name, str):
        raise ValueError(f"voice name must be text (got {type(name).__name__})")
    name = clean_name(name)
    if not name:
        raise ValueError("voice name is empty (spaces and control characters do not count); type a name")
    if name.endswith(VOICE_EXT):
        name = clean_name(name[: -len(VOICE_EXT)])
    if "/" in name or "\\" in name or ".." in name or not _VOICE_NAME.match(name):
        raise ValueError(
            f"invalid voice name {name!r}: use letters, digits, space, '_', '-' or '.', start with a letter or "
            "digit, at most 100 characters, no path separators and no '..'"
        )
    return name + VOICE_EXT


def list_voices(voice_dirs: list[str]) -> list[str]:
    """Voice names (without extension) found in the voice folders."""
    names = set()
    for d in voice_dirs:
        try:
            files = os.listdir(d) if os.path.isdir(d) else []
        except OSError:  # an unreadable folder holds no voices we can load; the node list must still build
            continue
        names.update(f[: -len(VOICE_EXT)] for f in files
                     if f.endswith(VOICE_EXT) and os.path.isfile(os.path.join(d, f)))
    return sorted(names, key=str.lower)


def subtitle_prefix(prefix: str, default_name: str = "subtitles") -> str:
    """SaveSubtitles' filename_prefix made safe for ComfyUI's numbered names: every folder and the file name
    cleaned (clean_name), empty parts dropped, and a prefix that names only a folder ('' or 'qwen3tts/') gets
    `default_name`. ComfyUI numbers files per file name; with an empty name it finds no earlier number and
    would write the same file every run."""
    parts = [clean_name(part) for part in re.split(r"[/\\]", str(prefix))]
    ends_in_folder = not parts[-1]
    parts = [part for part in parts if part]
    if ends_in_folder or not parts:
        parts.append(default_name)
    return "/".join(parts)


def repo_target(models_dir: str, repo: str) -> str:
    """Download target of an official repo: models/qwen3_tts/<repo name>."""
    if repo not in OFFICIAL_REPOS:
        raise ValueError(f"unknown repo {repo!r}; choose one of {', '.join(OFFICIAL_REPOS)}")
    return os.path.join(models_dir, FOLDER_KEY, repo.split("/", 1)[1])
