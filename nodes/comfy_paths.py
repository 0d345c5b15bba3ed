"""ComfyUI model folders for the pack: registration, listing, voices and the explicit download."""
from __future__ import annotations

import logging
import os

import folder_paths

from ..engine import files
from . import paths

log = logging.getLogger(__name__)


def register_folder() -> None:
    """Register models/qwen3_tts (idempotent). extra_model_paths.yaml may add more `qwen3_tts` paths."""
    folder_paths.add_model_folder_path(paths.FOLDER_KEY, own_dir(), is_default=True)


def _registered(key: str) -> list[str]:
    entry = folder_paths.folder_names_and_paths.get(key)
    return list(entry[0]) if entry else []


def roots() -> list[str]:
    extra = []
    for key in paths.FOREIGN_KEYS:
        extra += _registered(key)
    for key in ("TTS", "tts"):  # a yaml `TTS:` root: look in the sub-folders other packs use there
        for root in _registered(key):
            extra += [os.path.join(root, sub) for sub in ("Qwen3-TTS", "qwen3_tts", "Qwen3TTS")]
    return paths.candidate_roots(folder_paths.models_dir, _registered(paths.FOLDER_KEY), extra)


def checkpoints() -> dict[str, str]:
    return paths.find_checkpoints(roots())


def checkpoint_names() -> list[str]:
    return list(checkpoints())


def own_dir() -> str:
    return os.path.join(folder_paths.models_dir, paths.FOLDER_KEY)


def voice_dirs() -> list[str]:
    dirs = [os.path.join(own_dir(), paths.VOICES_SUBDIR)]
    dirs += [os.path.join(p, paths.VOICES_SUBDIR) for p in _registered(paths.FOLDER_KEY)]
    return list(dict.fromkeys(dirs))


def voice_save_dir() -> str:
    return os.path.join(own_dir(), paths.VOICES_SUBDIR)


def find_voice(name: str) -> str:
    """Absolute path of a saved voice; raises FileNotFoundError listing where it looked."""
    fname = paths.check_voice_name(name)
    for d in voice_dirs():
        p = os.path.join(d, fname)
        if os.path.isfile(p):
            return p
    for d in voice_dirs():  # there, but a directory, FIFO or device: say what it is, not "not found"
        p = os.path.join(d, fname)
        if os.path.lexists(p):
            files.input_file(p, f"voice {name!r}:", ValueError)
    raise FileNotFoundError(f"voice {name!r} not found; looked for {fname} in: {', '.join(voice_dirs())}")


def download(repo: str) -> str:
    """Fetch an official repo into models/qwen3_tts/<repo name> (only when the user asked for it)."""
    target = paths.repo_target(folder_paths.models_dir, repo)
    if os.path.isfile(os.path.join(target, "config.json")) and os.path.isfile(
            os.path.join(target, "model.safetensors")):
        return target
    manual = (f"Download the files of https://huggingface.co/{repo} yourself and put them in {target} "
              "(the folder must contain config.json, model.safetensors and speech_tokenizer/).")
    try:
        from huggingface_hub import snapshot_download  # optional dependency, only for this
    except ImportError as exc:
        raise RuntimeError(f"LoadQwen3TTS: downloading needs the optional package huggingface_hub "
                           f"(pip install huggingface_hub). {manual}") from exc
    log.info("Qwen3-TTS: downloading %s to %s", repo, target)
    try:
        snapshot_download(repo_id=repo, local_dir=target)
    except Exception as exc:  # network, auth, disk: all end in the same instruction
        raise RuntimeError(f"LoadQwen3TTS: could not download {repo} ({type(exc).__name__}: {exc}). "
                           f"{manual}") from exc
    return target
