"""StreamChunks: generate with streaming and push every chunk to the browser as it is produced."""
from __future__ import annotations

import base64

from ..engine.errors import InvalidInputError, ModeError
from . import common
from .comfy_api_compat import io
from .runner import Job
from .types import CATEGORY, EVENT, PREFIX, Qwen3TTSVoice


def _sender(node_id):
    """Send one event to the client that queued the prompt (no-op without a server, e.g. in tests)."""
    try:
        from server import PromptServer
    except ImportError:
        PromptServer = None
    server = getattr(PromptServer, "instance", None)

    def send(msg: dict) -> None:
        if server is None:
            return
        data = {k: v for k, v in msg.items() if k != "pcm"}
        data["node"] = str(node_id)
        data["prompt_id"] = getattr(server, "last_prompt_id", None)
        if "pcm" in msg:
            data["format"] = "f32le"
            data["pcm"] = base64.b64encode(msg["pcm"].contiguous().numpy().astype("<f4").tobytes()).decode("ascii")
        server.send_sync(EVENT, data, server.client_id)
    return send


class StreamChunks(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id=PREFIX + "StreamChunks", display_name="Qwen3-TTS Stream", category=CATEGORY,
            description="Generates one take with streaming and sends each chunk to the browser as soon as it is "
                        "decoded; the node's player plays the chunks gap-free and shows time to first audio and "
                        "real-time factor. Long text is split into pieces that are generated together as rows "
                        "of one batch; the player gets piece 1 as it is made and each later piece in turn. "
                        "Works with all three checkpoint types (CustomVoice uses speaker and "
                        "instruct, VoiceDesign uses instruct, Base uses voice). Outputs the full AUDIO at the end.",
            hidden=[io.Hidden.unique_id],
            inputs=[common.model_input(), common.text_input(),
                    io.Int.Input("chunk_size", default=8, min=1, max=64,
                                 tooltip="Codec frames per chunk (12.5 frames = 1 s). Smaller: less delay "
                                         "between chunks, more overhead. The first chunk is always at most 2 "
                                         "frames, for the earliest first audio (the audio is the same)."),
                    common.language_input(), common.seed_input(),
                    io.Combo.Input("speaker", options=common.speaker_options(), default="Vivian", optional=True,
                                   tooltip="CustomVoice checkpoints: a preset speaker, or one of a fine-tuned "
                                           "checkpoint found (from its config.json)."),
                    io.String.Input("instruct", multiline=True, default="", optional=True,
                                    tooltip="CustomVoice: optional style instruction. VoiceDesign: the voice "
                                            "description."),
                    Qwen3TTSVoice.Input("voice", optional=True,
                                        tooltip="Base checkpoints: the voice to clone (required for Base)."),
                    common.first_take_input(), *common.advanced_inputs()],
            outputs=[io.Audio.Output(display_name="audio", tooltip="The whole streamed take, [1, 1, samples].")])

    @classmethod
    def validate_inputs(cls, text, language, speaker=None) -> bool | str:
        return common.check_generator(text, language, speaker)

    @classmethod
    def execute(cls, model, text, chunk_size, language, seed, speaker="Vivian", instruct="", voice=None,
                **adv) -> io.NodeOutput:
        mode = common.MODE_OF_TYPE.get(model.model_type)
        kwargs = {}
        if mode == "clone":
            if voice is None:
                raise InvalidInputError("StreamChunks: a Base checkpoint clones a voice; connect a VOICE "
                                 "(ExtractSpeakerEmbedding or LoadVoice) to 'voice'.")
            kwargs["voice"] = voice
        elif mode == "custom":
            kwargs.update(speaker=speaker or "Vivian", instruct=instruct)
        elif mode == "design":
            kwargs["instruct"] = instruct
        else:
            raise ModeError(f"StreamChunks: unsupported checkpoint type {model.model_type!r}; load a Base, "
                            "CustomVoice or VoiceDesign checkpoint.")
        job = Job("StreamChunks", model, mode, text, language, seed=seed, takes=1, **kwargs, **adv)
        return io.NodeOutput(job.stream(chunk_size, _sender(cls.hidden.unique_id)))  # the engine checks chunk_size
