"""Voices: a speaker embedding (x-vector) plus, for ICL cloning, reference codes and transcript.

Saved as safetensors (never pickle) with metadata that ties the voice to a model family and size:
a 1.7B voice in bf16 is 2048 x 2 bytes = 4 KB of tensor data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import FAMILY, ModelConfig
from .errors import VoiceError

FORMAT = "qwen3tts-fast-voice"
VERSION = "1"


@dataclass
class Voice:
    spk_embedding: torch.Tensor  # [width], in the model dtype
    model_size: str  # tts_model_size of the model that made it ("0b6", "1b7", ...)
    family: str = FAMILY
    ref_codes: torch.Tensor | None = None  # [frames, 16] ICL reference codes
    ref_text: str | None = None

    @property
    def width(self) -> int:
        return int(self.spk_embedding.shape[-1])

    @property
    def is_icl(self) -> bool:
        return self.ref_codes is not None

    def check_compatible(self, cfg: ModelConfig) -> None:
        """Raise VoiceError unless this voice can drive the given model."""
        if self.family != FAMILY:
            raise VoiceError(f"this voice was made for model family '{self.family}', not {FAMILY}.")
        if self.width != cfg.embedding_width or self.model_size != cfg.tts_model_size:
            raise VoiceError(
                f"this voice was extracted with a {self.model_size} model (embedding width {self.width}) but the loaded "
                f"model is {cfg.tts_model_size or 'unnamed'} (width {cfg.embedding_width}). Speaker embeddings do not "
                "carry over between model sizes: extract the voice again with this model."
            )

    def save(self, path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {"spk_embedding": self.spk_embedding.detach().cpu().contiguous()}
        meta = {"format": FORMAT, "version": VERSION, "family": self.family, "model_size": self.model_size,
                "width": str(self.width), "dtype": str(self.spk_embedding.dtype).replace("torch.", "")}
        if self.ref_codes is not None:
            tensors["ref_codes"] = self.ref_codes.detach().cpu().to(torch.int32).contiguous()
            meta["ref_text"] = json.dumps(self.ref_text or "")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path) -> "Voice":
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise VoiceError(f"voice file {path} does not exist.")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("format") != FORMAT:
                    raise VoiceError(f"{path.name} is not a Qwen3-TTS Fast voice file (no '{FORMAT}' metadata).")
                names = set(f.keys())
                if "spk_embedding" not in names:
                    raise VoiceError(f"{path.name} has no speaker embedding; the file is damaged, extract the voice again.")
                emb = f.get_tensor("spk_embedding")
                codes = f.get_tensor("ref_codes").to(torch.long) if "ref_codes" in names else None
                ref_text = json.loads(meta["ref_text"]) if "ref_text" in meta else None
        except VoiceError:
            raise
        except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as exc:
            raise VoiceError(f"{path.name} is corrupted or truncated ({exc}); extract the voice again.") from exc
        if emb.dim() != 1 or str(emb.shape[0]) != meta.get("width"):
            raise VoiceError(f"{path.name}: embedding shape {tuple(emb.shape)} does not match its metadata; extract the voice again.")
        if codes is not None and (codes.dim() != 2 or codes.shape[1] != 16):
            raise VoiceError(f"{path.name}: reference codes have shape {tuple(codes.shape)}, expected [frames, 16].")
        return cls(spk_embedding=emb, model_size=meta.get("model_size", ""), family=meta.get("family", ""),
                   ref_codes=codes, ref_text=ref_text)
