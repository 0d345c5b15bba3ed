"""Typed errors. Every message says what went wrong and what the user can do about it."""


class Qwen3TTSError(Exception):
    """Base class of every error the engine raises on purpose."""


class CheckpointError(Qwen3TTSError):
    """A checkpoint directory is incomplete, inconsistent or of an unknown kind."""


class InvalidInputError(Qwen3TTSError, ValueError):
    """A request argument (text, speaker, language, audio, sampling value) is unusable."""


class ReferenceAudioError(InvalidInputError):
    """Reference audio for a voice is unusable: empty, silent, too short, not finite, or at a rate that cannot
    be resampled."""


class ModeError(Qwen3TTSError, ValueError):
    """The requested mode does not exist on this checkpoint (e.g. clone on a CustomVoice model)."""


class PromptTooLongError(Qwen3TTSError, ValueError):
    """The prompt plus the requested frames do not fit the static KV cache."""


class VoiceError(Qwen3TTSError, ValueError):
    """A voice file is not ours, is corrupted, or belongs to another model size or family."""


class OutputPathError(Qwen3TTSError, ValueError):
    """A file the caller asked for cannot be written there: its folder is missing or not writable, the path is a
    directory, FIFO or device (never replaced), or no file system can hold its name (too long, a NUL byte).
    Checked before any synthesis, so no work is lost."""


class UnsupportedConfigError(Qwen3TTSError):
    """An accelerator or device option was forced on where it cannot run."""


class GenerationInterrupted(Qwen3TTSError):
    """The caller's should_stop() asked the decode loop to stop; the engine stays usable."""


class EngineBusyError(Qwen3TTSError, RuntimeError):
    """The engine is held by another call (see engine/engine_lock.py); nothing was run."""


class QueueFullError(Qwen3TTSError, RuntimeError):
    """Too many requests are already waiting (the scheduler's bound, or the speech server's --max-queue); nothing
    was queued. Retry later."""


class SchedulerClosedError(Qwen3TTSError, RuntimeError):
    """The scheduler was closed: its queued and running requests end with this error and it takes no more."""
