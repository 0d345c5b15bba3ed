"""Voices: ExtractSpeakerEmbedding, SaveVoice and LoadVoice (safetensors in models/qwen3_tts/voices/)."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile

from ..engine import files
from ..engine.errors import InvalidInputError, OutputPathError
from . import comfy_paths, common, engine_cache, paths
from .audio_utils import batch_item
from .comfy_api_compat import io
from .runner import engine_errors
from .types import CATEGORY, PREFIX, Qwen3TTSVoice


def _check_name(name) -> bool | str:
    if name is None:
        return True
    try:
        paths.check_voice_name(name)
    except ValueError as exc:
        return str(exc)
    return True


def _not_a_file(path: str) -> str | None:
    """What stands at a voice's path when it is not a regular file (or a link to one), in words; else None."""
    if os.path.islink(path) and not os.path.exists(path):
        return "a link to a missing file"
    try:
        mode = os.stat(path).st_mode
    except OSError:  # nothing there, or unreadable: files.output_file says which
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return None if stat.S_ISREG(mode) else f"not a regular file (it is {files.kind(mode)})"


class ExtractSpeakerEmbedding(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "ExtractSpeakerEmbedding", display_name="Qwen3-TTS Extract Voice", category=CATEGORY,
            description="Turns a reference recording into a VOICE for VoiceClone (Base checkpoint). Any sample "
                        "rate, mono or stereo. With the reference transcript (ref_text) the voice also keeps the "
                        "reference's codec codes and clones in ICL mode; without it, only the x-vector is used.",
            inputs=[common.model_input(),
                    io.Audio.Input("audio", tooltip="Reference speech, ideally 3-20 s of one clean speaker."),
                    io.Int.Input("batch_index", default=0, min=0, max=63,
                                 tooltip="Which item of the AUDIO batch to use."),
                    io.String.Input("ref_text", multiline=True, default="", optional=True,
                                    tooltip="Exact transcript of the reference audio. Fill it in for ICL cloning "
                                            "(closer timbre and prosody); leave empty for x-vector only.")],
            outputs=[Qwen3TTSVoice.Output(display_name="voice",
                                          tooltip="Speaker embedding (+ ICL codes and text) for VoiceClone.")])

    @classmethod
    def execute(cls, model, audio, batch_index, ref_text="") -> io.NodeOutput:
        common.require_type("ExtractSpeakerEmbedding", model, "base")
        try:
            wav = batch_item(audio, batch_index)
        except (ValueError, IndexError) as exc:
            raise InvalidInputError(f"ExtractSpeakerEmbedding: {exc}") from exc
        engine = engine_cache.acquire(model.key)
        with engine_errors("ExtractSpeakerEmbedding"):  # the engine checks the rate; empty ref_text: x-vector only
            voice = engine.extract_voice(wav, audio.get("sample_rate"), ref_text=ref_text)
        return io.NodeOutput(voice)


class SaveVoice(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "SaveVoice", display_name="Qwen3-TTS Save Voice", category=CATEGORY,
            description="Saves a VOICE as models/qwen3_tts/voices/<name>.safetensors (safetensors only, never "
                        "pickle) so LoadVoice can reuse it in any workflow.",
            is_output_node=True,
            inputs=[Qwen3TTSVoice.Input("voice", tooltip="The voice to save."),
                    io.String.Input("name", default="my_voice",
                                    tooltip="File name without extension: letters, digits, space, _ - . ; no "
                                            "path separators, no '..'."),
                    io.Boolean.Input("overwrite", default=True,
                                     tooltip="Replace an existing voice of the same name.")],
            outputs=[io.String.Output(display_name="name",
                                      tooltip="The saved name; connect it to LoadVoice to load it right after.")])

    @classmethod
    def validate_inputs(cls, name) -> bool | str:
        return _check_name(name)

    @classmethod
    def execute(cls, voice, name, overwrite) -> io.NodeOutput:
        try:
            fname = paths.check_voice_name(name)  # cleaned first: the overwrite check sees the real file name
        except ValueError as exc:
            raise InvalidInputError(f"SaveVoice: {exc}") from exc
        saved = fname[: -len(paths.VOICE_EXT)]
        folder = comfy_paths.voice_save_dir()
        path = os.path.join(folder, fname)
        special = _not_a_file(path)
        if special:  # the generic advice (a file name inside it) would be a path, which a voice name cannot be
            raise OutputPathError(f"SaveVoice: the voice file {path} is {special} and is never replaced; choose "
                                  f"another name, or move it out of {folder}.")
        try:
            os.makedirs(folder, exist_ok=True)
            files.output_file(path, "SaveVoice: the voice file")  # never a directory, FIFO or device, nor a link to one
        except OSError as exc:
            raise OutputPathError(f"SaveVoice: cannot use the voices folder {folder} ({exc.strerror or exc}); "
                                  "check that it is a writable folder.") from exc
        replaced = os.path.exists(path)
        if replaced and not overwrite:
            raise InvalidInputError(f"SaveVoice: a voice named {saved!r} exists ({path}); enable overwrite or "
                                    "choose another name")
        if replaced and paths.clean_name(name) != name:  # overwrite replaces the voice the user named, not one a cleaned name hits
            raise InvalidInputError(f"SaveVoice: the name {name!r} is saved as {saved!r} (spaces and control "
                                    f"characters cleaned), and a voice named {saved!r} exists ({path}); type "
                                    f"{saved!r} exactly to replace it, or choose another name")
        # A fresh, exclusively created temporary name (never a fixed one a link could be planted at, never
        # shared by two saves), renamed into place; removed again if the save fails.
        tmp = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{fname}.", suffix=".tmp")
            os.close(fd)
            voice.save(tmp)
            os.replace(tmp, path)
        except BaseException as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if isinstance(exc, (OSError, OutputPathError)):  # Voice.save words an OSError as OutputPathError
                cause = exc if isinstance(exc, OSError) else exc.__cause__ or exc
                reason = getattr(cause, "strerror", None) or cause
                raise RuntimeError(f"SaveVoice: could not write {path} ({reason}); check that the folder is "
                                   "writable and has space.") from exc
            raise
        notes = [f"saved {path}"]
        if paths.clean_name(name) != name:
            notes.append(f"the name {name!r} was saved as {saved!r} (spaces and control characters cleaned)")
        if replaced:
            notes.append(f"it replaced the voice {saved!r} saved before")
        return io.NodeOutput(saved, ui={"text": ["; ".join(notes)]})


class LoadVoice(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = paths.list_voices(comfy_paths.voice_dirs()) or ["(no saved voices yet)"]
        return io.Schema(
            node_id=PREFIX + "LoadVoice", display_name="Qwen3-TTS Load Voice", category=CATEGORY,
            description="Loads a voice saved by SaveVoice and checks it belongs to this model family and size. "
                        "Files that are not Qwen3-TTS voices are rejected; nothing is ever unpickled.",
            inputs=[common.model_input(),
                    io.Combo.Input("voice_name", options=names, default=names[0],
                                   tooltip="A saved voice from models/qwen3_tts/voices/."),
                    io.String.Input("name_override", optional=True, force_input=True,
                                    tooltip="Optional: a name from SaveVoice's output. When connected it is "
                                            "loaded instead of voice_name, after SaveVoice has run.")],
            outputs=[Qwen3TTSVoice.Output(display_name="voice", tooltip="The loaded voice, checked against model.")])

    @classmethod
    def validate_inputs(cls, voice_name, name_override=None) -> bool | str:
        return _check_name(name_override) if name_override else _check_name(voice_name)

    @classmethod
    def fingerprint_inputs(cls, voice_name, name_override=None, **_):
        name = name_override or voice_name
        try:
            p = comfy_paths.find_voice(name)
            return f"{name}:{os.path.getmtime(p)}:{os.path.getsize(p)}"
        except (OSError, ValueError):  # execute reports it
            return name

    @classmethod
    def execute(cls, model, voice_name, name_override=None) -> io.NodeOutput:
        from ..engine import Voice

        try:
            path = comfy_paths.find_voice(name_override or voice_name)
        except (FileNotFoundError, ValueError) as exc:
            raise InvalidInputError(f"LoadVoice: {exc}") from exc
        with engine_errors(f"LoadVoice: {path}"):
            voice = Voice.load(path)  # the file first: a damaged or huge one costs no model load
        engine = engine_cache.acquire(model.key)
        with engine_errors(f"LoadVoice: {path}"):
            engine.check_voice(voice)
        return io.NodeOutput(voice)
