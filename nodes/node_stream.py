"""StreamChunks: generate with streaming and push every chunk to the browser as it is produced."""
from __future__ import annotations

import base64
import contextlib
import time

from ..engine.errors import InvalidInputError, ModeError
from . import common
from .comfy_api_compat import io
from .runner import Job
from .types import CATEGORY, EVENT, PREFIX, Qwen3TTSVoice


def _queued_ms(server, prompt_id) -> int | None:
    """When ComfyUI queued the running prompt `prompt_id` (its extra_data create_time, ms of the server's wall
    clock), or None where this ComfyUI does not record it."""
    queue = getattr(server, "prompt_queue", None)
    running = getattr(queue, "currently_running", None)
    if prompt_id is None or not isinstance(running, dict):
        return None
    with getattr(queue, "mutex", None) or contextlib.nullcontext():
        items = list(running.values())
    for item in items:  # (number, prompt_id, prompt, extra_data, outputs, ...)
        if isinstance(item, (tuple, list)) and len(item) > 3 and item[1] == prompt_id and isinstance(item[3], dict):
            t = item[3].get("create_time")
            return int(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
    return None


def _sender(node_id):
    """Send one event to the client that queued the prompt (no-op without a server, e.g. in tests). The start
    message carries when the prompt was queued and when it was sent (queued_ms, sent_ms: the server's clock), so
    the player times first audio from the queue, as the user waits, not from the start of the stream."""
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
        if msg.get("phase") == "start":
            data["queued_ms"] = _queued_ms(server, data["prompt_id"])
            data["sent_ms"] = int(time.time() * 1000)
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
                    io.Int.Input("chunk_frames", default=8, min=1, max=64,
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
    def execute(cls, model, text, chunk_frames, language, seed, speaker="Vivian", instruct="", voice=None,
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
        return io.NodeOutput(job.stream(chunk_frames, _sender(cls.hidden.unique_id)))  # the engine checks chunk_frames
