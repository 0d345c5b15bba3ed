"""BlendVoices: 2-4 VOICEs mixed by weight into one (engine/voice_blend.py: x-vectors only)."""
from __future__ import annotations

from .comfy_api_compat import io
from .runner import engine_errors
from .types import CATEGORY, PREFIX, Qwen3TTSVoice

SLOTS = 4
WEIGHT_MAX = 100.0  # the widget's range and the node's check


def _weight(i: int) -> io.Input:
    return io.Float.Input(f"weight_{i}", default=1.0, min=0.0, max=WEIGHT_MAX, step=0.05, optional=i > 2,
                          tooltip=f"Share of voice_{i} in the blend; weights are relative (1 and 3 = 25 % / 75 %).")


class BlendVoices(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        inputs = []
        for i in range(1, SLOTS + 1):
            inputs.append(Qwen3TTSVoice.Input(f"voice_{i}", optional=i > 2,
                                              tooltip=f"Voice {i} (ExtractSpeakerEmbedding, LoadVoice or another "
                                                      "blend)." + (" Optional." if i > 2 else "")))
            inputs.append(_weight(i))
        return io.Schema(
            node_id=PREFIX + "BlendVoices", display_name="Qwen3-TTS Blend Voices", category=CATEGORY,
            description="Mixes 2-4 voices into a new one by weighting their speaker embeddings (x-vectors). All "
                        "voices must come from the same model size. ICL voices take part with their x-vector "
                        "only (reference codes are one recording and cannot be averaged), so the blend always "
                        "clones in x-vector mode. Save it with SaveVoice like any voice.",
            inputs=inputs,
            outputs=[Qwen3TTSVoice.Output(display_name="voice", tooltip="The blended x-vector voice.")])

    @classmethod
    def execute(cls, voice_1, voice_2, weight_1, weight_2, voice_3=None, weight_3=1.0, voice_4=None, weight_4=1.0
                ) -> io.NodeOutput:
        from ..engine import blend_voices, checks

        given = [(i, v, w) for i, (v, w) in enumerate(((voice_1, weight_1), (voice_2, weight_2),
                                                       (voice_3, weight_3), (voice_4, weight_4)), start=1)
                 if v is not None]
        with engine_errors("BlendVoices"):
            for i, _, w in given:  # the widgets' range (the engine takes any finite weight >= 0)
                checks.real_number(f"weight_{i}", w, 0.0, WEIGHT_MAX, hint="Weights are relative: 1 and 3 give "
                                                                          "25 % and 75 %.")
            voice = blend_voices([v for _, v, _ in given], [w for _, _, w in given],
                                 labels=[f"voice_{i}" for i, _, _ in given])
        icl = [f"voice_{i}" for i, v, _ in given if v.is_icl]
        note = f"{', '.join(icl)}: ICL, blended by x-vector only" if icl else "x-vector blend"
        shares = ", ".join(f"voice_{i} {w / sum(x for *_, x in given):.0%}" for i, _, w in given)
        return io.NodeOutput(voice, ui={"text": [f"{shares} ({note})"]})
