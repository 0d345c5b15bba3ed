"""LoadQwen3TTS: pick (or explicitly download) a checkpoint directory and load the engine, or reach a speech
server that runs one (`server`), which every node then works against."""
from __future__ import annotations

import os

from ..engine import checks
from ..engine.serve.options import API_KEY_ENV  # the server's own variable for its key, read when api_key is empty
from . import comfy_paths, engine_cache, paths
from .comfy_api_compat import io
from .common import MAX_TAKES, check_combo
from .runner import engine_errors
from .types import CATEGORY, PREFIX, Qwen3TTSModel

DTYPES = ["auto", "bf16", "fp16", "fp32"]
SWITCH = ["auto", "on", "off"]
NO_DOWNLOAD = "no (use checkpoint)"
NONE_FOUND = "(no checkpoint found - see tooltip)"
DOWNLOAD_OPTIONS = [NO_DOWNLOAD, *paths.OFFICIAL_REPOS]
CODEC_AUTO = "auto (its own, else a sibling's)"


def _codec_options() -> list[str]:
    return [CODEC_AUTO, *paths.codec_choices(comfy_paths.checkpoints())]


def _server_url(server) -> str | None:
    """The server URL typed into `server`, or None when it is empty (run here)."""
    return server.strip() if isinstance(server, str) and server.strip() else None


def _describe(info, name: str, server: str = "") -> str:
    """The info output: what the load chose and what runs, here or (`server`: its --max-takes line) on a server."""
    kernels = ", ".join(info.kernels) if info.kernels else "none"
    lines = [f"{name}: {info.model_type} {info.model_size}"]
    if info.random_weights:
        lines.append("RANDOM weights (a test checkpoint): the audio is noise, not speech")
    graphs = "on" if info.cuda_graphs else "off"
    lines += [f"{'server: ' if server else ''}device {info.device}, dtype {info.dtype}, CUDA graphs {graphs}",
              f"kernels: {kernels}"]
    if server:
        lines.append(server)
    lines += [f"note: {n}" for n in info.notes]
    return "\n".join(lines)


class LoadQwen3TTS(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = comfy_paths.checkpoint_names() or [NONE_FOUND]
        return io.Schema(
            node_id=PREFIX + "LoadQwen3TTS",
            display_name="Load Qwen3-TTS Model",
            category=CATEGORY,
            description="Loads a Qwen3-TTS-12Hz checkpoint directory (Base, CustomVoice or VoiceDesign) from "
                        "models/qwen3_tts/ or the folders other Qwen3-TTS packs use, and shows what actually "
                        "runs: device, dtype, CUDA graphs and kernels. The engine stays cached and is freed "
                        "by ComfyUI's 'Unload models'. With 'server', it reaches a speech server on another machine "
                        "(`python -m engine serve`) instead, and every node runs there.",
            inputs=[
                io.Combo.Input("checkpoint", options=names, default=names[0],
                               tooltip="A checkpoint DIRECTORY (with config.json) under models/qwen3_tts/, "
                                       "models/Qwen3-TTS, models/qwen-tts, models/TTS/Qwen3-TTS, "
                                       "models/TTS/qwen3_tts, models/tts/Qwen3TTS or extra_model_paths.yaml "
                                       "key qwen3_tts."),
                io.Combo.Input("dtype", options=DTYPES, default="auto",
                               tooltip="Weight precision. auto: bf16 on a GPU that supports it, else fp32."),
                io.Combo.Input("cuda_graphs", options=SWITCH, default="auto",
                               tooltip="Capture the decode step as CUDA graphs (GPU only). auto: on where "
                                       "possible; on: error if impossible; off: never."),
                io.Combo.Input("triton", options=SWITCH, default="auto",
                               tooltip="Fused Triton kernels (GPU only). auto: use when available; on: error "
                                       "if unavailable; off: plain PyTorch."),
                io.Int.Input("max_takes", default=4, min=1, max=MAX_TAKES,
                             tooltip="Largest number of takes generated at once. The load reserves GPU memory "
                                     "for that many parallel takes (about 1 GB each at 0.6B, for their K/V "
                                     "cache and graphs) and captures their graphs, so no later run waits."),
                io.Combo.Input("download", options=DOWNLOAD_OPTIONS, default=NO_DOWNLOAD,
                               optional=True,
                               tooltip="Only when set: fetch this official repo with huggingface_hub into "
                                       "models/qwen3_tts/<repo name> (if not already there) and load it "
                                       "instead of 'checkpoint'."),
                io.Combo.Input("codec", options=_codec_options(), default=CODEC_AUTO, optional=True,
                               tooltip="The codec (speech_tokenizer/) to run with. auto: the checkpoint's own; a "
                                       "repacked folder without one borrows a compatible checkpoint's next to it. "
                                       "Or name the checkpoint whose codec to use. The info output says which."),
                io.String.Input("server", default="", optional=True,
                                tooltip="Empty: run here. Or the URL of a speech server on a GPU machine, e.g. "
                                        "http://192.168.1.20:8000 (start it there with `python -m engine serve "
                                        "--model <checkpoint folder> --host 0.0.0.0`): every node then runs on it, "
                                        "and checkpoint, dtype, cuda_graphs, triton, max_takes, download and codec "
                                        "are the server's. The same seed gives the same audio as here."),
                io.String.Input("api_key", default="", optional=True,
                                tooltip="The server's API key (its --api-key), when it has one. It is saved in the "
                                        f"workflow as typed; leave it empty to use ComfyUI's {API_KEY_ENV} "
                                        "environment variable instead."),
            ],
            outputs=[
                Qwen3TTSModel.Output(display_name="model", tooltip="The loaded model for the generator nodes."),
                io.String.Output(display_name="info", tooltip="What actually runs: device, dtype, graphs, kernels."),
            ],
        )

    @classmethod
    def validate_inputs(cls, checkpoint, dtype, cuda_graphs, triton, download=NO_DOWNLOAD,
                        codec=CODEC_AUTO, server="") -> bool | str:
        for name, value, options in (("dtype", dtype, DTYPES), ("cuda_graphs", cuda_graphs, SWITCH),
                                     ("triton", triton, SWITCH),
                                     ("download", download, DOWNLOAD_OPTIONS), ("codec", codec, _codec_options())):
            ok = check_combo(name, value, options)
            if ok is not True:
                return ok
        if _server_url(server) is not None:  # the checkpoint is the server's
            from ..engine.remote.http import parse_url

            try:
                parse_url(server)
            except ValueError as exc:
                return f"server: {exc}"
            return True
        if download in (None, NO_DOWNLOAD) and checkpoint not in comfy_paths.checkpoints():
            return (f"checkpoint {checkpoint!r} not found. Put the checkpoint directory (with config.json) in "
                    f"{comfy_paths.own_dir()}, or choose a repo under 'download'.")
        return True

    @classmethod
    def execute(cls, checkpoint, dtype, cuda_graphs, triton, max_takes, download=NO_DOWNLOAD,
                codec=CODEC_AUTO, server="", api_key="") -> io.NodeOutput:
        url = _server_url(server)
        if url is not None:
            key = api_key.strip() if isinstance(api_key, str) and api_key.strip() else os.environ.get(API_KEY_ENV)
            with engine_errors("LoadQwen3TTS"):  # unreachable, a wrong key: the message says what to do
                engine = engine_cache.connect(url, key)
            info = _describe(engine.info, f"{engine.model_id} on {engine.config.url}",
                             f"max_takes {engine.max_takes} (the server's --max-takes)")
            ref = engine_cache.ModelRef(key=engine.config, name=f"{engine.model_id} @ {engine.config.url}",
                                        model_type=engine.model_type)
            return io.NodeOutput(ref, info, ui={"text": [info]})
        if download and download != NO_DOWNLOAD:
            model_dir, name = comfy_paths.download(download), download.split("/", 1)[1]
        else:
            found = comfy_paths.checkpoints()
            if checkpoint not in found:
                raise FileNotFoundError(f"LoadQwen3TTS: checkpoint {checkpoint!r} not found under "
                                        f"{comfy_paths.own_dir()}")
            model_dir, name = found[checkpoint], checkpoint
        codec_dir = ""
        if codec and codec != CODEC_AUTO:
            found = comfy_paths.checkpoints()
            if codec not in found:
                raise FileNotFoundError(f"LoadQwen3TTS: codec checkpoint {codec!r} not found under "
                                        f"{comfy_paths.own_dir()}")
            codec_dir = os.path.realpath(found[codec])
        with engine_errors("LoadQwen3TTS"):  # the widget's range: an engine holds more rows only for a server
            checks.whole_number("max_takes", max_takes, 1, MAX_TAKES)
        # Every takes count up to max_takes is captured at load: no request waits for a capture.
        key = engine_cache.EngineConfig(model_dir=os.path.realpath(model_dir), device=engine_cache.comfy_device(),
                                        dtype=dtype, cuda_graphs=cuda_graphs, triton=triton, max_takes=int(max_takes),
                                        codec_dir=codec_dir, warm_takes=int(max_takes))
        try:
            with engine_errors("LoadQwen3TTS"):  # a broken checkpoint: the engine's message, naming this node
                engine = engine_cache.acquire(key)
        except OSError as exc:
            raise RuntimeError(f"LoadQwen3TTS: could not read the checkpoint {model_dir} ({exc.strerror or exc}"
                               f"{': ' + str(exc.filename) if exc.filename else ''}); check that the folder and its "
                               "files are readable.") from exc
        info = _describe(engine.info, name)
        ref = engine_cache.ModelRef(key=key, name=name, model_type=engine.model_type)
        return io.NodeOutput(ref, info, ui={"text": [info]})
