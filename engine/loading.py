"""Loading: an EngineConfig becomes a ready Engine, its CUDA graphs captured and every request path warmed."""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .decode import Row, decode_rows
from .engine_config import EngineConfig
from .errors import InvalidInputError, UnsupportedConfigError
from .gpu.buckets import warm_buckets
from .limits import MAX_ROWS
from .prompt import MODE_OF_MODEL, Request
from .voice import Voice

log = logging.getLogger(__name__)

# With the torch attention, frame graphs are captured at load for windows of up to this many positions (a
# 200-token prompt plus 45 s of audio); longer requests capture theirs once, on first use. With the Triton
# attention one graph a bucket serves every position.
PRECAPTURE_WINDOW = 768

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class EngineInfo:
    """What a load chose and what actually runs; `summary()` is one line for UIs."""

    model_dir: str
    model_type: str
    model_size: str
    device: str
    dtype: str
    cuda_graphs: bool = False
    kernels: list = field(default_factory=list)  # the Triton kernels that actually run
    notes: list = field(default_factory=list)  # what was chosen, and why something is off
    codec_dir: str = ""  # the codec folder in use (speech_tokenizer/ of this or another checkpoint)
    codec_origin: str = "own"  # own | chosen (codec_dir given) | sibling (found next to the checkpoint)
    graph_bytes: int = 0  # device memory the load reserved beyond the weights: graphs, their caches and buffers
    random_weights: bool = False  # a random-weight checkpoint (RANDOM_WEIGHTS.json): its audio is noise

    def summary(self) -> str:
        graphs = "on" if self.cuda_graphs else "off"
        kern = ", ".join(self.kernels) if self.kernels else "none"
        random = "; RANDOM weights (noise)" if self.random_weights else ""
        return (f"{self.model_type} {self.model_size} on {self.device} ({self.dtype}); CUDA graphs {graphs}; "
                f"Triton kernels {kern}{random}")


def resolve_device(device: str) -> torch.device:
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedConfigError(f"device '{device}' is not a device; use auto, cpu or cuda.") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedConfigError("device 'cuda' was requested but no CUDA GPU is available; use device 'cpu'.")
    if dev.type not in ("cpu", "cuda"):
        raise UnsupportedConfigError(f"device '{device}' is not supported; use 'cpu' or 'cuda'.")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UnsupportedConfigError(f"device '{device}' does not exist: this machine has "
                                     f"{torch.cuda.device_count()} CUDA device(s), cuda:0 to "
                                     f"cuda:{torch.cuda.device_count() - 1}.")
    if dev.type == "cuda" and dev.index is None:  # name the card: other threads (the scheduler's) pin it
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UnsupportedConfigError(f"dtype '{dtype}' is not supported; use one of auto, {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def check_config(config: EngineConfig) -> None:
    """Every field of the config, before any work."""
    if not isinstance(config, EngineConfig):
        raise InvalidInputError(f"Engine.load takes an EngineConfig or a folder (got {type(config).__name__}).")
    config.check()


def load_engine(engine_cls, config: EngineConfig):
    """Load `config` into an `engine_cls` (engine.Engine): weights, codec, CUDA graphs, warm-up."""
    from . import kernels
    from .checkpoint.loader import load_components
    from .checkpoint.writer import is_random_checkpoint

    check_config(config)
    dev = resolve_device(config.device)
    dt = resolve_dtype(config.dtype, dev)
    if config.cuda_graphs == "on" and dev.type != "cuda":
        raise UnsupportedConfigError("CUDA graphs need a CUDA device; set cuda_graphs to auto or off, or use device cuda.")
    try:
        ks, kernel_note = kernels.select(config.triton, dev, plan_rows=MAX_ROWS if config.batch_invariant else None)
    except kernels.KernelUnavailableError as exc:
        raise UnsupportedConfigError(f"{exc}. Set triton to auto or off.") from exc
    if config.batch_invariant and not ks:  # the torch ops pick their own sum order by shape
        raise UnsupportedConfigError(f"batch_invariant needs the Triton kernels, and here they do not run "
                                     f"({kernel_note}). Load on a CUDA GPU with triton auto or on, or without "
                                     "batch_invariant.")
    notes = [kernel_note]
    if config.batch_invariant and dev.type == "cuda":
        # One shape gives one sum order only with deterministic algorithms: cuDNN may otherwise run the codec's
        # transposed convs with atomic adds. The switch is the process's; it is named in the load's notes.
        torch.backends.cudnn.deterministic = True
        notes.append("cuDNN: deterministic algorithms (batch invariant; for this whole process)")
    t0 = time.perf_counter()
    graphs = dev.type == "cuda" and config.cuda_graphs != "off"
    early = {"reserved": torch.cuda.memory_reserved(dev) if graphs else 0}

    def codec_loaded(decoder) -> None:  # called while the talker's weights are still being read
        if dev.type == "cuda" and ks:  # the codec's SnakeBeta activations (CUDA inputs only), before capture
            decoder.use_kernels(ks)
        if graphs:
            from .gpu.codec_graph import CodecGraphs

            early["codec"] = CodecGraphs(decoder)
            early["codec"].precapture_beside(warm_buckets(config.warm_takes))

    codec_dir = Path(config.codec_dir) if config.codec_dir else None
    try:
        parts = load_components(Path(config.model_dir), dev, dt, codec_dir, codec_loaded=codec_loaded)
    except BaseException:
        if "codec" in early:  # its threads must not outlive the load that started them
            with contextlib.suppress(Exception):
                early["codec"].release()
        raise
    cfg = parts["config"]
    source = parts["codec_source"]
    if source.origin != "own":
        notes.append(source.describe())
    info = EngineInfo(model_dir=config.model_dir, model_type=cfg.tts_model_type, model_size=cfg.tts_model_size,
                      device=str(dev), dtype=str(dt).replace("torch.", ""), notes=notes,
                      codec_dir=str(source.path), codec_origin=source.origin,
                      random_weights=is_random_checkpoint(config.model_dir) or is_random_checkpoint(source.path))
    engine = engine_cls(config=config, cfg=cfg, defaults=parts["defaults"], tokenizer=parts["tokenizer"],
                        talker=parts["talker"], speaker_encoder=parts["speaker_encoder"], codec=parts["codec"],
                        device=dev, dtype=dt, info=info)
    if graphs:
        weights = sum(t.numel() * t.element_size() for m in (engine.talker, engine.speaker_encoder, engine.codec)
                      if m is not None for t in [*m.parameters(), *m.buffers()])
        _enable_graphs(engine, forced=config.cuda_graphs == "on", kernels=ks, codec=early["codec"],
                       reserved_before=early["reserved"] + weights)
    else:
        notes.append(f"CUDA graphs: off ({'CPU' if dev.type == 'cpu' else 'cuda_graphs=off'})")
        if ks:  # the kernels live in the fused single-token path: run it uncaptured
            from .gpu.frame_graph import GraphedFrames

            engine.runner = GraphedFrames(engine.talker, config.max_seq_len, capture=False, kernels=ks)
    engine.info.kernels = list(engine.runner.active_kernels)
    log.info("loaded %s in %.1f s: %s", config.model_dir, time.perf_counter() - t0, info.summary())
    return engine


def _enable_graphs(engine, forced: bool, kernels, codec, reserved_before: int) -> None:
    """Switch to whole-frame CUDA graphs and codec piece graphs, capturing what requests will replay (which
    proves capture works) at load. `codec`: the CodecGraphs whose pieces started capturing beside the
    talker's loading; `reserved_before`: device memory reserved without any graph, for the memory note."""
    from .gpu.frame_graph import GraphedFrames

    config = engine.config
    graphed = GraphedFrames(engine.talker, config.max_seq_len, kernels=kernels)
    eager = engine.runner
    engine.runner, engine.codec_graphs = graphed, codec
    try:
        warm_up(engine)
    except Exception as exc:  # capture failed: say so once and run eagerly
        engine.runner, engine.codec_graphs = eager, None
        graphed.release()
        codec.release()
        if forced:
            raise UnsupportedConfigError(f"CUDA graph capture failed ({type(exc).__name__}: {exc}).") from exc
        without = " without the Triton kernels" if kernels else ""  # the eager runner runs torch ops only
        msg = f"CUDA graphs: capture failed ({type(exc).__name__}: {exc}); running eagerly{without}"
        log.warning(msg)
        engine.info.notes.append(msg)
        return
    engine.info.cuda_graphs = True
    pre = graphed.prefill_graphs
    prefill_note = (f"prefill graphs for prompts up to {max(pre.buckets)} tokens in {pre.capture_seconds:.2f} s"
                    if pre is not None else "no prefill graphs")
    # The warm-ups' transient blocks go back to the device once, here; what stays is the graphs' pools and
    # static buffers.
    torch.cuda.empty_cache()
    engine.info.graph_bytes = max(torch.cuda.memory_reserved(engine.device) - reserved_before, 0)
    rows = " and ".join(str(b) for b in warm_buckets(config.warm_takes))
    engine.info.notes.append(f"CUDA graphs: on ({len(graphed.graphs)} frame graphs of {rows} rows, {graphed.reach}, "
                             f"in {graphed.capture_seconds:.2f} s; {prefill_note}; graphs and their static buffers "
                             f"take {engine.info.graph_bytes / 1e9:.2f} GB)")
    if codec.failure is not None:  # CodecGraphs logged the warning; the frame graphs stay on
        engine.codec_graphs = None
        codec.release()
        if forced:
            raise UnsupportedConfigError(f"codec CUDA graph capture failed ({codec.failure}).")
        engine.info.notes.append(f"codec CUDA graphs: capture failed ({codec.failure}); the codec decodes eagerly")
        return
    engine.info.notes.append(f"codec CUDA graphs: on ({codec.captures} piece graphs of 1-32 frames for {rows} rows, "
                             f"{codec.capture_seconds:.2f} s of captures; calls of up to {config.warm_takes} takes "
                             "run on these, more capture theirs before their first request decodes)")


def warm_up(engine) -> None:
    """Capture the graphs requests replay, and run each request path once, so that the first request pays
    none of its first-run costs (side streams, the first launch of each op)."""
    cfg = engine.cfg
    mode = MODE_OF_MODEL[cfg.tts_model_type]
    if mode == "clone":
        voice = Voice(spk_embedding=torch.zeros(cfg.embedding_width, dtype=engine.dtype), model_size=cfg.tts_model_size)
        req = Request(mode=mode, text="Warm up.", voice=voice)
    else:
        req = Request(mode=mode, text="Warm up.", speaker=(engine.speakers or [None])[0], instruct="")
    # A checkpoint's min_new_tokens may exceed the 2 warm-up frames; validation must not fail the capture.
    warm = engine.defaults.capped(2)
    # The frames alone first: the codec's graphs are still being captured beside them.
    prompt, params, max_frames = engine.prepare(req, 1, warm)
    for _ in decode_rows(engine.runner, [Row(prompt, 0, max_frames)], slots=1, params=params,
                         eos_id=cfg.talker.codec_eos_id):
        pass
    buckets = warm_buckets(engine.config.warm_takes)
    precapture = getattr(engine.runner, "precapture", None)
    if callable(precapture):  # prefill buckets, and the frame graphs of common windows at one take and warm_takes
        precapture(buckets, PRECAPTURE_WINDOW)
    if engine.codec_graphs is None:
        return
    engine.codec_graphs.precapture(buckets)
    engine.generate(req, params=warm)
    for _ in engine.stream(req, params=warm, chunk_frames=2, first_chunk_frames=1):
        pass
    if engine.config.warm_takes > 1:  # the takes' own path: the prompt's K/V copied to every row, shared reads
        engine.generate(req, takes=engine.config.warm_takes, params=warm)
        for _ in engine.stream(req, takes=engine.config.warm_takes, params=warm, chunk_frames=2):
            pass
    for bucket in buckets:  # the shared codec states are left fresh, as the capture left them
        engine.codec_graphs.state(bucket).zero_()
