"""Which codec (speech_tokenizer/) a checkpoint runs with: its own, one the user chose, or a sibling's.

Repacked and fine-tuned folders sometimes ship without speech_tokenizer/. Every Qwen3-TTS-12Hz checkpoint
uses the same 12 Hz codec, so such a folder can borrow the codec of another installed checkpoint: one the
user names (`codec_dir`), or else the first compatible one next to it (same parent folder). The choice is
always reported (EngineInfo.codec), never silent.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

CODEC_SUBDIR = "speech_tokenizer"
CODEC_FILES = ("config.json", "model.safetensors", "preprocessor_config.json")
CODEC_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"


@dataclass(frozen=True)
class CodecSource:
    path: Path  # the codec folder (holding CODEC_FILES)
    origin: str  # "own" | "chosen" | "sibling"

    def describe(self) -> str:
        if self.origin == "own":
            return f"codec: its own {CODEC_SUBDIR}/"
        how = "chosen by the user" if self.origin == "chosen" else "found automatically: the checkpoint has none"
        return f"codec: {self.path} ({how})"


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, or nested too deeply
        return None
    return data if isinstance(data, dict) else None


def codec_folder(d: Path) -> Path | None:
    """`d` itself if it is a complete codec folder, else `d/speech_tokenizer` if that one is; otherwise None."""
    for candidate in (d, d / CODEC_SUBDIR):
        if all((candidate / f).is_file() for f in CODEC_FILES):
            cfg = _read(candidate / "config.json")
            if cfg is not None and cfg.get("model_type") == CODEC_MODEL_TYPE:
                return candidate
    return None


def incompatibility(codec_dir: Path, num_code_groups: int, codebook_size: int) -> str | None:
    """Why the codec in `codec_dir` cannot decode this talker's codes, or None if it can."""
    dec = (_read(codec_dir / "config.json") or {}).get("decoder_config")
    found = (dec.get("num_quantizers"), dec.get("codebook_size")) if isinstance(dec, dict) else (None, None)
    if found != (num_code_groups, codebook_size):
        return (f"its codes are {found[0]} codebooks x {found[1]} entries, the model's are {num_code_groups} x "
                f"{codebook_size}")
    return None


def _siblings(model_dir: Path, size: str) -> list[Path]:
    """Other folders next to model_dir; those of the same model size first (then by name)."""
    parent = model_dir.resolve().parent
    try:
        dirs = [d for d in parent.iterdir() if d.is_dir() and d.resolve() != model_dir.resolve()]
    except OSError:
        return []
    same_size = lambda d: (_read(d / "config.json") or {}).get("tts_model_size") == size
    return sorted(dirs, key=lambda d: (not same_size(d), d.name.lower()))


def resolve_codec(model_dir: Path, codec_dir: str | Path | None, size: str, num_code_groups: int,
                  codebook_size: int) -> CodecSource:
    """The codec this checkpoint runs with (see the module docstring); CheckpointError naming what is missing."""
    model_dir = Path(model_dir)
    if codec_dir is not None:
        chosen = codec_folder(Path(codec_dir))
        if chosen is None:
            raise CheckpointError(
                f"codec folder {codec_dir} holds no Qwen3-TTS-12Hz codec: it needs {', '.join(CODEC_FILES)} "
                f"(itself or in its {CODEC_SUBDIR}/ subfolder). Choose a checkpoint folder that has "
                f"{CODEC_SUBDIR}/, or its {CODEC_SUBDIR}/ folder.")
        why = incompatibility(chosen, num_code_groups, codebook_size)
        if why:
            raise CheckpointError(f"the codec in {chosen} does not fit {model_dir.name}: {why}.")
        return CodecSource(chosen, "chosen")
    if (model_dir / CODEC_SUBDIR).is_dir():  # complete: checked by reader.check_layout
        return CodecSource(model_dir / CODEC_SUBDIR, "own")
    for sibling in _siblings(model_dir, size):
        found = codec_folder(sibling)
        if found is not None and incompatibility(found, num_code_groups, codebook_size) is None:
            return CodecSource(found, "sibling")
    raise CheckpointError(
        f"checkpoint {model_dir} has no {CODEC_SUBDIR}/ folder (the 12 Hz codec: {', '.join(CODEC_FILES)}), and "
        f"no checkpoint next to it in {model_dir.resolve().parent} has one that fits. Install any official "
        "Qwen3-TTS-12Hz checkpoint (or Qwen/Qwen3-TTS-Tokenizer-12Hz) in that folder, copy its "
        f"{CODEC_SUBDIR}/ into {model_dir}, or choose a codec folder (loader input 'codec', Engine.load codec_dir, CLI --codec-dir).")
