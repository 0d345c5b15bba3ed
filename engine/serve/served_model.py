"""What the server serves: the loaded checkpoint as /v1/models names it, and the saved voices it may use."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import VoiceError
from ..kept import Kept

VOICE_SUFFIX = ".safetensors"
VOICES_KEPT = 64  # saved voices kept read (the least recently used dropped first)
# A voice is named by its file's stem, by the rule SaveVoice names files with: letters, digits, blanks, dots,
# dashes, underscores. No separator can appear, so a request cannot reach a file outside the voices folder.
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.\-]{0,99}")


@dataclass
class ServedModel:
    id: str  # the checkpoint folder's name, which requests give as `model`
    model_type: str  # base, custom_voice or voice_design
    mode: str  # the engine mode of the checkpoint: clone, custom or design
    speakers: list
    languages: list
    max_takes: int
    defaults: object  # the checkpoint's SamplingParams
    check_voice: object  # engine.check_voice
    voices_dir: Path | None = None
    random_weights: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    # Saved voices read and checked, by file: (modification time, size, Voice). A request naming a voice finds it
    # here while its file is unchanged, instead of reading and checking the file in the request's path.
    _loaded: Kept = field(default_factory=lambda: Kept(VOICES_KEPT), repr=False)

    @classmethod
    def of(cls, engine, max_takes: int, voices_dir: Path | None = None) -> ServedModel:
        from ..prompt import MODE_OF_MODEL

        return cls(id=Path(engine.config.model_dir).name, model_type=engine.model_type,
                   mode=MODE_OF_MODEL[engine.model_type], speakers=list(engine.speakers or []),
                   languages=list(engine.languages or []), max_takes=max_takes, defaults=engine.defaults,
                   check_voice=engine.check_voice, voices_dir=voices_dir, random_weights=engine.info.random_weights)

    def saved_voices(self) -> list[str]:
        if self.voices_dir is None or not self.voices_dir.is_dir():
            return []
        return sorted(p.name[: -len(VOICE_SUFFIX)] for p in self.voices_dir.glob("*" + VOICE_SUFFIX)
                      if p.is_file() and _VOICE_NAME.fullmatch(p.name[: -len(VOICE_SUFFIX)]))

    def voice_file(self, name: str) -> Path:
        """The saved voice file `name` names (with or without its suffix), or VoiceError saying what exists."""
        stem = name.removesuffix(VOICE_SUFFIX)
        if self.voices_dir is None:
            raise VoiceError(f"voice '{name}' would be a saved voice, but this server has no voices folder; start "
                             "it with --voices DIR, or send reference_audio (with reference_text) instead.")
        path = self.voices_dir / (stem + VOICE_SUFFIX)
        if not _VOICE_NAME.fullmatch(stem) or not path.is_file():
            known = ", ".join(self.saved_voices()) or "none"
            raise VoiceError(f"no saved voice '{name}' in the voices folder. Saved voices: {known}.")
        return path

    def saved_voice(self, name: str):
        """The saved voice `name` names, read and checked (VoiceError otherwise), or the one read before while its
        file is unchanged. Voices are only read, so requests share one."""
        from ..voice import Voice

        path = self.voice_file(name)
        try:
            stat = path.stat()
        except OSError as exc:
            raise VoiceError(f"voice file {path.name} cannot be read ({exc.strerror or exc}); save the voice again.") \
                from exc
        kept = self._loaded.get(path)
        if kept is not None and kept[:2] == (stat.st_mtime_ns, stat.st_size):
            return kept[2]
        voice = Voice.load(path)
        self.check_voice(voice)
        self._loaded.put(path, (stat.st_mtime_ns, stat.st_size, voice))  # a file saved anew replaces its own entry
        return voice

    def card(self) -> dict:
        """The OpenAI model object, with what a request may use."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "qwen3-tts-fast",
                "model_type": self.model_type, "mode": self.mode, "speakers": self.speakers,
                "languages": self.languages, "max_takes": self.max_takes, "random_weights": self.random_weights}
