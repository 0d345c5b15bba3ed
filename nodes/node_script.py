"""Script (a dialogue or narration, one `Name: text` per line, with pauses) and SaveSubtitles."""
from __future__ import annotations

import os

from ..engine import files
from ..engine.errors import OutputPathError
from . import common, paths
from .comfy_api_compat import io
from .script_cast import VOICE_SLOTS, line_requests
from .script_parse import ScriptError, Utterance, check_names, parse_cast, parse_script
from .script_run import run_script
from .script_track import check_silence
from .types import CATEGORY, PREFIX, Qwen3TTSVoice

EXAMPLE_SCRIPT = "Alice: Did you hear that?\nBob [whispering]: Hear what?\n[pause 0.8s]\nAlice: Exactly."
EXAMPLE_VOICES = "Alice = Vivian\nBob = Ryan"
LINE_GAP_MAX = 10.0  # seconds: the widget's range and the node's check


def _parse(script: str, voices: str):
    events, cast = parse_script(script), parse_cast(voices)
    check_names(events, cast)
    return events, cast


class Script(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "Script", display_name="Qwen3-TTS Script", category=CATEGORY,
            description="Speaks a script: one 'Name: text' per line, 'Name [instruction]: text' for a line's own "
                        "style, '[pause 0.8s]' on its own line for a pause. The voices table gives every name a "
                        "voice: a preset speaker (CustomVoice), voice_1..voice_4 (Base, from the VOICE inputs) or "
                        "a voice description (VoiceDesign). All lines are generated as one batch. Outputs the "
                        "whole track, every line as one AUDIO batch, and SRT subtitles.",
            inputs=[common.model_input(),
                    io.String.Input("script", multiline=True, default=EXAMPLE_SCRIPT,
                                    tooltip="One utterance per line: 'Name: text' or 'Name [instruction]: text'. "
                                            "'[pause 0.8s]' or '[pause 800ms]' on its own line (up to 10 min; pauses "
                                            "and line gaps together up to 20 min). Blank lines and lines starting "
                                            "with # are skipped."),
                    io.String.Input("voices", multiline=True, default=EXAMPLE_VOICES,
                                    tooltip="One 'Name = voice' per line. CustomVoice: a preset speaker (Ryan). "
                                            "Base: voice_1 .. voice_4 (the VOICE inputs below, x-vector or ICL). "
                                            "VoiceDesign: a description of the voice."),
                    common.language_input(), common.seed_input(),
                    io.Float.Input("line_gap", default=0.3, min=0.0, max=LINE_GAP_MAX, step=0.01,
                                   tooltip="Seconds of silence between two lines where no pause tag stands."),
                    io.Boolean.Input("names_in_subtitles", default=True,
                                     tooltip="Start every subtitle with the speaker's name ('Alice: ...')."),
                    *[Qwen3TTSVoice.Input(slot, optional=True,
                                          tooltip=f"A VOICE for names mapped to {slot} (Base models).")
                      for slot in VOICE_SLOTS],
                    *common.advanced_inputs()],
            outputs=[io.Audio.Output(display_name="track", tooltip="The whole script as one AUDIO at 24 kHz."),
                     io.Audio.Output(display_name="lines",
                                     tooltip="Every line as one AUDIO batch [lines, 1, samples], zero-padded, "
                                             "with each line's length (PickTake picks one)."),
                     io.String.Output(display_name="subtitles",
                                      tooltip="SRT subtitles: every line's start and end in the track.")])

    @classmethod
    def validate_inputs(cls, script=None, voices=None, language=None) -> bool | str:
        if script is not None and voices is not None:
            try:
                _parse(script, voices)
            except ScriptError as exc:
                return str(exc)
        return common.check_combo("language", language, common.LANGUAGES)

    @classmethod
    def execute(cls, model, script, voices, language, seed, line_gap, names_in_subtitles, voice_1=None,
                voice_2=None, voice_3=None, voice_4=None, **adv) -> io.NodeOutput:
        from ..engine import checks
        from ..engine.errors import InvalidInputError

        slots = dict(zip(VOICE_SLOTS, (voice_1, voice_2, voice_3, voice_4)))
        try:  # before any engine work: the script, the voices and the silence they add
            gap_ms = round(checks.real_number("line_gap", line_gap, 0.0, LINE_GAP_MAX,
                                              hint="It is the silence between two lines, in seconds.") * 1000)
            events, cast = _parse(script, voices)
            check_silence(events, gap_ms)
            lines = [e for e in events if isinstance(e, Utterance)]
            fields = line_requests(lines, cast, model.model_type, common.speaker_options(), slots)
        except ValueError as exc:  # ScriptError, or the engine's InvalidInputError for line_gap
            raise InvalidInputError(f"Script: {exc}") from exc
        out = run_script("Script", model, events, fields, language, seed, gap_ms, bool(names_in_subtitles), **adv)
        return io.NodeOutput(out.track, out.lines, out.subtitles)


class SaveSubtitles(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "SaveSubtitles", display_name="Qwen3-TTS Save Subtitles", category=CATEGORY,
            description="Writes subtitles (SRT text, e.g. from the Script node) to the output folder as "
                        "<prefix>_00001_.srt, numbered like SaveAudio's files.",
            is_output_node=True,
            inputs=[io.String.Input("subtitles", force_input=True, tooltip="SRT text from the Script node."),
                    io.String.Input("filename_prefix", default="qwen3tts/subtitles",
                                    tooltip="Path under the output folder, without extension; a folder alone "
                                            "('qwen3tts/') saves as subtitles in it. Every run writes a new "
                                            "numbered file.")],
            outputs=[])

    @classmethod
    def execute(cls, subtitles, filename_prefix) -> io.NodeOutput:
        import folder_paths

        out_dir = folder_paths.get_output_directory()
        prefix = paths.subtitle_prefix(filename_prefix)
        # names no file system can hold are refused before any folder is made (the number adds 8 characters)
        files.check_name(os.path.join(out_dir, f"{prefix}_00001_.srt"), "SaveSubtitles: filename_prefix",
                         OutputPathError)
        try:
            folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(prefix, out_dir)
        except OSError as exc:
            raise OutputPathError(f"SaveSubtitles: cannot use the folder of {prefix!r} under {out_dir} "
                                  f"({exc.strerror or exc}); choose another filename_prefix.") from exc
        except Exception as exc:  # ComfyUI refuses a prefix that leaves the output folder with a bare Exception
            raise OutputPathError(f"SaveSubtitles: filename_prefix {filename_prefix!r} points outside the output "
                                  f"folder {out_dir}; use a path under it, e.g. qwen3tts/subtitles.") from exc
        fname = f"{name}_{counter:05}_.srt"
        path = os.path.join(folder, fname)
        try:
            with open(path, "x", encoding="utf-8") as f:  # "x": never replace a file, even one made meanwhile
                f.write(subtitles)
        except (FileExistsError, IsADirectoryError, NotADirectoryError) as exc:
            raise OutputPathError(f"SaveSubtitles: {path} exists ({exc.strerror or exc}) and is never replaced; run "
                                  "again for the next number, or choose another filename_prefix.") from exc
        except OSError as exc:
            raise RuntimeError(f"SaveSubtitles: could not write {path} ({exc.strerror or exc}); check that the "
                               "output folder is writable and has space.") from exc
        return io.NodeOutput(ui={"text": [os.path.join(subfolder, fname)],
                                 "subtitles": [{"filename": fname, "subfolder": subfolder, "type": "output"}]})
