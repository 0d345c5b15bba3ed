"""PickTake: one take out of a batch, padding trimmed; its widget previews every take."""
from __future__ import annotations

from .audio_utils import pick_take, take_lengths, take_origin
from .comfy_api_compat import io, ui
from .types import CATEGORY, PREFIX


def _preview_takes(audio: dict, cls) -> list[dict]:
    """Save every take (trimmed) to temp/ and describe it for the web takes widget: file, index, length and,
    when the batch carries its origin, the generator node, seed and take (the first_take that renders it
    alone)."""
    sr = int(audio["sample_rate"])
    out = []
    for i, length in enumerate(take_lengths(audio)):
        take = pick_take(audio, i)
        saved = ui.AudioSaveHelper.save_audio(take, filename_prefix=f"qwen3tts_take{i}", cls=cls,
                                              folder_type=io.FolderType.temp, format="flac")
        out.append(dict(saved[0]) | {"index": i, "samples": length, "duration": round(length / sr, 3)}
                   | (take_origin(audio, i) or {}))
    return out


class PickTake(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "PickTake", display_name="Qwen3-TTS Pick Take", category=CATEGORY,
            description="Selects one take of an AUDIO batch and trims its padding. The node shows a player, "
                        "the duration, the seed and the take number of every take; 'use this take' sets the "
                        "index and pins the generator's seed (fixed, back to the seed these takes came from), "
                        "so the next queue re-runs only PickTake. ComfyUI's own audio preview plays only the "
                        "first item of a batch.",
            is_output_node=True,
            inputs=[io.Audio.Input("audio", tooltip="A batch of takes from VoiceClone, CustomVoice or VoiceDesign."),
                    io.Int.Input("index", default=0, min=0, max=63,
                                 tooltip="Which take to output (0 = first).")],
            outputs=[io.Audio.Output(display_name="audio", tooltip="The chosen take, [1, 1, samples], trimmed.")])

    @classmethod
    def execute(cls, audio, index) -> io.NodeOutput:
        n = audio["waveform"].shape[0]
        if index >= n:
            raise IndexError(f"PickTake: index {index} but the batch has {n} take(s) (0..{n - 1})")
        takes = _preview_takes(audio, cls)
        return io.NodeOutput(pick_take(audio, int(index)), ui={"qwen3tts_takes": takes, "qwen3tts_picked": [index]})
