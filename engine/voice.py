"""Voices: a speaker embedding (x-vector) plus, for ICL cloning, reference codes and transcript.

Saved as safetensors (never pickle) with metadata that ties the voice to a model family and size:
a 1.7B voice in bf16 is 2048 x 2 bytes = 4 KB of tensor data.
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from . import checks, files
from .config import FAMILY, ModelConfig
from .errors import OutputPathError, VoiceError

FORMAT = "qwen3tts-fast-voice"
VERSION = "1"
CODE_GROUPS = 16  # codebooks per codec frame
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # float8 cannot even be checked
# Any integer type holds valid codes (0..2047 fit int16; a uint8 or int8 file holds the low ones); the range is
# checked in int64, so a narrow type never wraps the codebook size.
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
              *(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)))
REF_TEXT_HINT = "type the transcript of the reference audio, or leave ref_text empty to clone from the x-vector only."
# The largest voice: a float64 embedding of 2048 plus 60 s of reference codes (750 frames x 16 x 4 bytes) and
# its transcript is under 100 KB; 16 MB leaves room for any transcript and refuses other files before reading.
MAX_VOICE_BYTES = 16 << 20


def _header_length(head: bytes, size: int, name: str) -> int:
    """A safetensors file starts with the length of its JSON header (8 bytes, little-endian); a length the
    file (`size` bytes) cannot hold is refused before anything else is read."""
    if len(head) < 8:
        raise VoiceError(f"{name} is {size} bytes, too short for a voice file; extract the voice again.")
    (n,) = struct.unpack("<Q", head[:8])
    if n > size - 8:
        raise VoiceError(f"{name}: its header declares {n:,} bytes but the file holds {size - 8:,} after it; "
                         "the file is truncated or not a voice file. Extract the voice again.")
    return n


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

    def check_contents(self, name: str = "this voice") -> None:
        """Raise VoiceError unless the tensors are what a voice holds: a finite float embedding [width] and,
        for ICL, integer codes [frames, 16] together with their transcript."""
        emb = self.spk_embedding
        if not isinstance(emb, torch.Tensor) or emb.dim() != 1 or emb.numel() == 0 or emb.dtype not in FLOAT_DTYPES:
            what = f"{emb.dtype} {tuple(emb.shape)}" if isinstance(emb, torch.Tensor) else type(emb).__name__
            raise VoiceError(f"{name}: the speaker embedding must be a float vector [width], not {what}; "
                             "the file is damaged or not a voice, extract the voice again.")
        if not bool(torch.isfinite(emb).all()):
            raise VoiceError(f"{name}: the speaker embedding holds NaN or Inf values; extract the voice again.")
        if not isinstance(self.model_size, str) or not isinstance(self.family, str):
            raise VoiceError(f"{name}: model_size and family must be strings; extract the voice again.")
        codes = self.ref_codes
        if codes is None:
            return
        if (not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.shape[1] != CODE_GROUPS
                or codes.shape[0] == 0 or codes.dtype not in INT_DTYPES):
            what = f"{codes.dtype} {tuple(codes.shape)}" if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise VoiceError(f"{name}: reference codes must be integers [frames, {CODE_GROUPS}], not {what}; "
                             "extract the voice again.")
        if not isinstance(self.ref_text, str) or not checks.has_visible(self.ref_text):
            raise VoiceError(f"{name} holds ICL reference codes but no reference text; extract the voice again "
                             "with its transcript (ref_text), or without it for an x-vector-only voice.")

    def check_compatible(self, cfg: ModelConfig) -> None:
        """Raise VoiceError unless this voice can drive the given model."""
        self.check_contents()
        if self.family != FAMILY:
            raise VoiceError(f"this voice was made for model family '{self.family}', not {FAMILY}.")
        if self.width != cfg.embedding_width or self.model_size != cfg.tts_model_size:
            raise VoiceError(
                f"this voice was extracted with a {self.model_size} model (embedding width {self.width}) but the loaded "
                f"model is {cfg.tts_model_size or 'unnamed'} (width {cfg.embedding_width}). Speaker embeddings do not "
                "carry over between model sizes: extract the voice again with this model."
            )
        codebook = cfg.talker.predictor.vocab_size
        codes = None if self.ref_codes is None else self.ref_codes.to(torch.int64)
        if codes is not None and not bool(((codes >= 0) & (codes < codebook)).all()):
            raise VoiceError(f"this voice's reference codes lie outside the codebook (0..{codebook - 1}); the file is "
                             "damaged, extract the voice again.")

    def save(self, path) -> Path:
        """Write the voice to `path` through a fresh temporary file in the same folder, renamed into place: an
        existing voice is only ever replaced by a complete file, and a path that is not a regular file (a
        directory, FIFO or device, or a link to one) is refused, never replaced. Path problems are
        OutputPathError. A voice that check_contents refuses (a NaN embedding, say) is never written: it would
        only fail again at load."""
        data = self.to_bytes()
        path = files.check_name(path, "voice file", OutputPathError)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(f"voice file {path}: cannot create the folder {path.parent} "
                                  f"({exc.strerror or exc}); choose another folder.") from exc
        files.output_file(path, "voice file")
        # O_EXCL on a random name: never a file (or link) someone else made, never one shared by two saves
        tmp = path.with_name(f".voice-{uuid.uuid4().hex}.tmp")
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise OutputPathError(f"voice file {path} could not be written ({exc.strerror or exc}); check that "
                                  "the folder is writable and has space.") from exc
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    def to_bytes(self) -> bytes:
        """The voice file's bytes (what save writes): a voice crosses a network as these. A voice that
        check_contents refuses is never written."""
        from safetensors.torch import save

        self.check_contents()
        tensors = {"spk_embedding": self.spk_embedding.detach().cpu().contiguous()}
        meta = {"format": FORMAT, "version": VERSION, "family": self.family, "model_size": self.model_size,
                "width": str(self.width), "dtype": str(self.spk_embedding.dtype).replace("torch.", "")}
        if self.ref_codes is not None:
            tensors["ref_codes"] = self.ref_codes.detach().cpu().to(torch.int32).contiguous()
            meta["ref_text"] = json.dumps(self.ref_text or "")
        return save(tensors, metadata=meta)

    @classmethod
    def load(cls, path) -> Voice:
        path = files.check_name(path, "voice file", VoiceError)
        size = files.input_file(path, "voice file", VoiceError).st_size
        if size > MAX_VOICE_BYTES:  # checked before reading: a voice is a few KB, a large file is something else
            raise VoiceError(f"voice file {path} is {size:,} bytes; a voice file is at most {MAX_VOICE_BYTES:,} "
                             "bytes. Choose a file saved by SaveVoice (Voice.save).")
        try:
            with open(path, "rb") as fh:
                head = fh.read(8)
                _header_length(head, size, path.name)  # before the rest is read
                data = head + fh.read()
        except OSError as exc:
            raise VoiceError(f"{path.name} is corrupted or truncated ({exc}); extract the voice again.") from exc
        return cls.from_bytes(data, path.name)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "voice_data") -> Voice:
        """The Voice in a voice file's bytes, checked as a file is; errors name `name` (the file or the field)."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        if not isinstance(data, (bytes, bytearray)):
            raise VoiceError(f"{name} must be the bytes of a voice file, not {type(data).__name__}.")
        if len(data) > MAX_VOICE_BYTES:
            raise VoiceError(f"{name} is {len(data):,} bytes; a voice file is at most {MAX_VOICE_BYTES:,} bytes.")
        data = bytes(data)
        try:
            header = json.loads(data[8: 8 + _header_length(data, len(data), name)])
            meta = (header.get("__metadata__") if isinstance(header, dict) else None) or {}
            if meta.get("format") != FORMAT:
                raise VoiceError(f"{name} is not a Qwen3-TTS Fast voice file (no '{FORMAT}' metadata); "
                                 "choose a file saved by SaveVoice (Voice.save), or extract the voice again.")
            tensors = load(data)
            if "spk_embedding" not in tensors:
                raise VoiceError(f"{name} has no speaker embedding; the file is damaged, extract the voice again.")
            emb, codes = tensors["spk_embedding"], tensors.get("ref_codes")
            ref_text = json.loads(meta["ref_text"]) if "ref_text" in meta else None
        except VoiceError:
            raise
        except (SafetensorError, ValueError, TypeError, AttributeError) as exc:  # JSONDecodeError is a ValueError
            raise VoiceError(f"{name} is corrupted or truncated ({exc}); extract the voice again.") from exc
        voice = cls(spk_embedding=emb, model_size=meta.get("model_size", ""), family=meta.get("family", ""),
                    ref_codes=codes, ref_text=ref_text)
        voice.check_contents(name)
        if str(emb.shape[0]) != meta.get("width"):
            raise VoiceError(f"{name}: embedding shape {tuple(emb.shape)} does not match its metadata; extract the voice again.")
        if codes is not None:
            voice.ref_codes = codes.to(torch.long)
        return voice
