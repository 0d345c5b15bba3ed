"""Inputs shared by the generator nodes, and the checks that go with them."""
from __future__ import annotations

from ..engine.checks import has_visible
from ..engine.errors import ModeError
from ..engine.limits import MAX_TAKES, SEED_MAX, TAKE_STREAMS
from . import sampling
from .comfy_api_compat import io
from .text_split import DEFAULT_MAX_UNITS
from .types import Qwen3TTSModel

LANGUAGES = ["Auto", "Chinese", "English", "Japanese", "Korean", "German", "French", "Russian", "Portuguese",
             "Spanish", "Italian"]
SPEAKERS = ["Vivian", "Serena", "Uncle_Fu", "Dylan", "Eric", "Ryan", "Aiden", "Ono_Anna", "Sohee"]
MODE_OF_TYPE = {"base": "clone", "custom_voice": "custom", "voice_design": "design"}
NODE_OF_TYPE = {"base": "VoiceClone (with ExtractSpeakerEmbedding or LoadVoice)", "custom_voice": "CustomVoice",
                "voice_design": "VoiceDesign"}
TYPE_NAME = {"base": "Base", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}
FIRST_TAKE_MAX = TAKE_STREAMS - 1
MIN_SEGMENT_CHARS, MAX_SEGMENT_CHARS = 20, 5000


def model_input() -> io.Input:
    return Qwen3TTSModel.Input("model", tooltip="A Qwen3-TTS model from LoadQwen3TTS.")


def text_input() -> io.Input:
    return io.String.Input("text", multiline=True, default="Hello! This is Qwen3-TTS running inside ComfyUI.",
                           tooltip="The text to speak. Long text is split at sentence boundaries and the "
                                   "pieces are joined seamlessly.")


def language_input() -> io.Input:
    return io.Combo.Input("language", options=LANGUAGES, default="Auto",
                          tooltip="Language of the text; Auto lets the model decide.")


def seed_input() -> io.Input:
    return io.Int.Input("seed", default=0, min=0, max=SEED_MAX, control_after_generate=True,
                        tooltip="Random seed. The same seed, text and settings give the same audio.")


def takes_input() -> io.Input:
    return io.Int.Input("takes", default=1, min=1, max=MAX_TAKES,
                        tooltip="How many takes to generate at once (one batch). Pick one with PickTake.")


def first_take_input() -> io.Input:
    # Not folded under "advanced": the example workflows' Notes tell users to set it next to seed and takes.
    return io.Int.Input(
        "first_take", default=0, min=0, max=FIRST_TAKE_MAX, optional=True,
        tooltip="Take i of this run is take first_take + i of the seed. To render take 3 of a run again on "
                "its own (longer text, another chunk size), keep the seed and set takes 1, first_take 3.")


def advanced_inputs() -> list[io.Input]:
    """Optional sampling overrides; every default means 'use the checkpoint's generation_config.json'."""
    out: list[io.Input] = [io.Int.Input("max_segment_chars", default=DEFAULT_MAX_UNITS, min=MIN_SEGMENT_CHARS,
                                        max=MAX_SEGMENT_CHARS,
                                        optional=True,
                                        tooltip="Longest text piece generated in one go (CJK characters "
                                                "count 3). Longer text is split at sentence boundaries.")]
    for wid, (_field, help_text) in sampling.SWITCHES.items():
        out.append(io.Combo.Input(wid, options=sampling.SWITCH_OPTIONS, default="checkpoint", optional=True,
                                  tooltip=help_text + " 'checkpoint' uses generation_config.json."))
    for wid, (_field, kind, lo, hi, help_text) in sampling.NUMERIC.items():
        tip = help_text + " -1 uses the checkpoint's generation_config.json value."
        if kind is int:
            out.append(io.Int.Input(wid, default=-1, min=-1, max=hi, optional=True, tooltip=tip))
        else:
            out.append(io.Float.Input(wid, default=-1.0, min=-1.0, max=hi, step=0.01, optional=True, tooltip=tip))
    return out


def check_text(text) -> bool | str:
    if text is None:  # linked input, unknown until it runs
        return True
    if not has_visible(str(text)):  # the engine's own check: blanks, controls and invisible characters only
        return "text is empty: type what should be spoken"
    return True


def check_combo(name: str, value, options: list[str]) -> bool | str:
    """ComfyUI 0.3.x does not check V3 combo values itself, so the nodes do."""
    if value is None or value in options:
        return True
    return f"{name} {value!r} is not one of {options}"


def speaker_options() -> list[str]:
    """The nine preset speakers, then the speakers of every CustomVoice checkpoint found whose name is new
    (fine-tuned ones: the official SFT script writes its own name into config.json)."""
    from . import comfy_paths, paths

    known = {s.lower() for s in SPEAKERS}
    extra = [s for s in paths.checkpoint_speakers(comfy_paths.checkpoints().values()) if s.lower() not in known]
    return SPEAKERS + list(dict.fromkeys(extra))


def check_generator(text, language, speaker=None) -> bool | str:
    """validate_inputs of the generator nodes: the first failing check's message, else True. (Numeric
    inputs are left out on purpose: ComfyUI skips its own min/max check for every input named here; the
    first_take + takes range is checked by the Job before the engine loads.)"""
    checks = [check_text(text), check_combo("language", language, LANGUAGES)]
    if speaker is not None:  # a linked or absent speaker is checked by the engine
        checks.append(check_combo("speaker", speaker, speaker_options()))
    for check in checks:
        if check is not True:
            return check
    return True


def require_type(node: str, ref, wanted: str) -> None:
    """Raise a clear error when a checkpoint of another type reaches a generator node."""
    if ref.model_type != wanted:
        raise ModeError(
            f"{node}: '{ref.name}' is a {TYPE_NAME.get(ref.model_type, ref.model_type)} checkpoint but {node} needs "
            f"a {TYPE_NAME[wanted]} checkpoint. For this model use the {NODE_OF_TYPE.get(ref.model_type, '?')} node.")
