"""PickTake: one take out of a batch, padding trimmed; its widget previews every take."""
from __future__ import annotations

import os

from .audio_utils import pick_take, take_lengths, take_origin
from .comfy_api_compat import io
from .types import CATEGORY, PREFIX


def _preview_takes(audio: dict) -> list[dict]:
    """Save every take (trimmed) to temp/ and describe it for the web takes widget: file, index, length and,
    when the batch carries its origin, the generator node, seed and take (the first_take that renders it
    alone). The previews are WAV files with the take's own channels: ComfyUI's V3 save helper writes a mono
    take as stereo at 0.707 (3 dB quieter than SaveAudio's file), so it is not used here."""
    import folder_paths

    from ..engine.audio import save_wav

    sr = int(audio["sample_rate"])
    out = []
    for i, length in enumerate(take_lengths(audio)):
        take = pick_take(audio, i)
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(
            f"qwen3tts_take{i}", folder_paths.get_temp_directory())
        fname = f"{name}_{counter:05}_.wav"
        try:
            save_wav(os.path.join(folder, fname), take["waveform"][0], sr)
        except OSError as exc:
            raise RuntimeError(f"PickTake: could not write the preview {os.path.join(folder, fname)} "
                               f"({exc.strerror or exc}); check that ComfyUI's temp folder is writable.") from exc
        out.append({"filename": fname, "subfolder": subfolder, "type": "temp", "index": i, "samples": length,
                    "duration": round(length / sr, 3)} | (take_origin(audio, i) or {}))
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
        from ..engine import checks
        from ..engine.errors import InvalidInputError

        n = audio["waveform"].shape[0]
        try:
            index = checks.whole_number("index", index, 0, n - 1, f"The batch has {n} take(s); 0 is the first.")
        except InvalidInputError as exc:
            raise InvalidInputError(f"PickTake: {exc}") from exc
        takes = _preview_takes(audio)
        return io.NodeOutput(pick_take(audio, int(index)), ui={"qwen3tts_takes": takes, "qwen3tts_picked": [index]})
