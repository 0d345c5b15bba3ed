"""The three generator nodes: VoiceClone, CustomVoice, VoiceDesign (AUDIO [takes, 1, T] at 24 kHz)."""
from __future__ import annotations

from . import common
from .comfy_api_compat import io
from .runner import Job
from .types import CATEGORY, PREFIX, Qwen3TTSVoice

AUDIO_OUT = "Takes as one batch [takes, 1, samples] at 24 kHz, zero-padded; each take's real length travels " \
            "with it so PickTake trims the padding."


def _outputs():
    return [io.Audio.Output(display_name="audio", tooltip=AUDIO_OUT)]


def _common_tail():
    return [common.language_input(), common.seed_input(), common.takes_input(), common.first_take_input(),
            *common.advanced_inputs()]


class VoiceClone(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "VoiceClone", display_name="Qwen3-TTS Voice Clone", category=CATEGORY,
            description="Speaks the text in a cloned voice (a VOICE from ExtractSpeakerEmbedding or LoadVoice). "
                        "Needs a Base checkpoint. A voice with reference text clones in ICL mode, otherwise "
                        "from the x-vector only. Outputs N takes as one AUDIO batch.",
            inputs=[common.model_input(),
                    Qwen3TTSVoice.Input("voice", tooltip="The voice to clone (ExtractSpeakerEmbedding or LoadVoice)."),
                    common.text_input(), *_common_tail()],
            outputs=_outputs())

    @classmethod
    def validate_inputs(cls, text, language) -> bool | str:
        return common.check_generator(text, language)

    @classmethod
    def execute(cls, model, voice, text, language, seed, takes, **adv) -> io.NodeOutput:
        common.require_type("VoiceClone", model, "base")
        return io.NodeOutput(Job("VoiceClone", model, "clone", text, language, voice=voice, seed=seed, takes=takes,
                                 **adv).generate())


class CustomVoice(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "CustomVoice", display_name="Qwen3-TTS Custom Voice", category=CATEGORY,
            description="Speaks the text with one of the preset speakers of a CustomVoice checkpoint, "
                        "optionally steered by an instruction (1.7B only; the 0.6B model ignores it). "
                        "Outputs N takes as one AUDIO batch.",
            inputs=[common.model_input(), common.text_input(),
                    io.Combo.Input("speaker", options=common.speaker_options(), default="Vivian",
                                   tooltip="Speaker of the CustomVoice checkpoint: the nine presets, then the "
                                           "speakers of fine-tuned checkpoints found (from their config.json)."),
                    io.String.Input("instruct", multiline=True, default="", optional=True,
                                    tooltip="Optional style instruction, e.g. 'Speak slowly and warmly.' "
                                            "Ignored by the 0.6B CustomVoice model."),
                    *_common_tail()],
            outputs=_outputs())

    @classmethod
    def validate_inputs(cls, text, language, speaker) -> bool | str:
        return common.check_generator(text, language, speaker)

    @classmethod
    def execute(cls, model, text, speaker, language, seed, takes, instruct="", **adv) -> io.NodeOutput:
        common.require_type("CustomVoice", model, "custom_voice")  # the engine checks the speaker itself
        return io.NodeOutput(Job("CustomVoice", model, "custom", text, language, speaker=speaker,
                                 instruct=instruct, seed=seed, takes=takes, **adv).generate())


class VoiceDesign(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "VoiceDesign", display_name="Qwen3-TTS Voice Design", category=CATEGORY,
            description="Speaks the text in a voice described in words (VoiceDesign checkpoint). "
                        "Outputs N takes as one AUDIO batch.",
            inputs=[common.model_input(), common.text_input(),
                    io.String.Input("instruct", multiline=True,
                                    default="A calm, warm female voice with a slight smile.",
                                    tooltip="Describe the voice: gender, age, timbre, mood, pace, accent."),
                    *_common_tail()],
            outputs=_outputs())

    @classmethod
    def validate_inputs(cls, text, language) -> bool | str:
        return common.check_generator(text, language)

    @classmethod
    def execute(cls, model, text, instruct, language, seed, takes, **adv) -> io.NodeOutput:
        common.require_type("VoiceDesign", model, "voice_design")
        return io.NodeOutput(Job("VoiceDesign", model, "design", text, language, instruct=instruct, seed=seed,
                                 takes=takes, **adv).generate())
