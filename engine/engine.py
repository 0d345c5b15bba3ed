"""The Engine: a loaded checkpoint plus everything needed to turn requests into audio."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checks, sampling
from .config import SAMPLE_RATE, SAMPLES_PER_FRAME, ModelConfig
from .decode import EagerFrames, Row, collect, decode_frames, decode_rows
from .engine_lock import EngineLock, serialised, serialised_stream
from .errors import (
    InvalidInputError,
    ModeError,
    PromptTooLongError,
    UnsupportedConfigError,
)
from .gpu.buckets import warm_buckets
from .host_audio import HostAudio, touching
from .prompt import MODE_OF_MODEL, Prompt, PromptBuilder, Request, expected_frames
from .sampling import MAX_NEW_TOKENS, SEED_MAX, SamplingParams, check_take_range
from .voice import Voice

log = logging.getLogger(__name__)

# Frame graphs captured at load, for one take and warm_takes: with the Triton attention one graph a bucket serves
# every position (the kernel reads each row's length on the device). With the torch attention, one graph a window,
# up to this many positions (a 200-token prompt plus 45 s of audio); longer requests capture theirs once, on first
# use. Other takes counts capture their bucket's graphs before their first request: each bucket holds its own
# static KV cache (~0.47 GB a row at 0.6B and 4096 positions), so they are only allocated when asked for.
PRECAPTURE_WINDOW = 768

# Frames a streamed request keeps queued on the GPU across each chunk's host work: the host waits there for
# the chunk's codec (1.8-2.2 ms at 8-16 frames) and hands the audio on, longer than one frame (2.9 ms at 0.6B
# on an H100) leaves room for; with one frame the frames' stream sat idle ~1 ms a chunk
# (bench/stream_timeline.py). A request ended by EOS drops up to this many frames once.
STREAM_AHEAD = 2

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SWITCHES = ("auto", "on", "off")


@dataclass
class EngineInfo:
    model_dir: str
    model_type: str
    model_size: str
    device: str
    dtype: str
    cuda_graphs: bool = False
    kernels: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    codec_dir: str = ""  # the codec folder in use (speech_tokenizer/ of this or another checkpoint)
    codec_origin: str = "own"  # own | chosen (codec_dir given) | sibling (found next to the checkpoint)
    graph_bytes: int = 0  # device memory the load reserved beyond the weights: graphs, their caches and buffers

    def summary(self) -> str:
        graphs = "on" if self.cuda_graphs else "off"
        kern = ", ".join(self.kernels) if self.kernels else "none"
        return f"{self.model_type} {self.model_size} on {self.device} ({self.dtype}); CUDA graphs {graphs}; kernels {kern}"


@dataclass
class Result:
    audio: torch.Tensor  # [takes, T_max] float32 CPU, zero-padded
    lengths: list  # samples per take
    codes: list  # LongTensor [frames_i, 16] per take
    sample_rate: int = SAMPLE_RATE
    stats: dict = field(default_factory=dict)


@dataclass
class BatchItem:
    """One request of a mixed batch (generate_batch): its takes draw from streams (seed, take_offset + i),
    so each item's result equals generate(request, takes, seed, take_offset=take_offset) alone (with
    max_new_tokens, if set, as the item's own frame budget in place of params.max_new_tokens)."""

    request: Request
    takes: int = 1
    seed: int = 0
    take_offset: int = 0
    max_new_tokens: int | None = None


@dataclass
class AudioChunk:
    audio: torch.Tensor  # [takes, k * 1920] float32 CPU; rows that ended are zero past `valid`
    valid: list  # real samples per take in this chunk
    codes: torch.Tensor  # [takes, k, 16]
    index: int
    elapsed_s: float
    final: bool


@dataclass
class RowChunk:
    """New audio of one take of one item of Engine.stream_batch."""

    item: int  # index into the items
    take: int  # 0 .. item.takes - 1 (stream take_offset + take)
    audio: torch.Tensor  # [k * 1920] float32 CPU: the take's next k frames of audio (k may be 0 at its end)
    codes: torch.Tensor  # [k, 16] those frames, CPU
    index: int  # 0, 1, 2, ... for this take
    final: bool  # the take's last chunk
    elapsed_s: float


def _resolve_device(device: str) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedConfigError("device 'cuda' was requested but no CUDA GPU is available; use device 'cpu'.")
    if dev.type not in ("cpu", "cuda"):
        raise UnsupportedConfigError(f"device '{device}' is not supported; use 'cpu' or 'cuda'.")
    return dev


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UnsupportedConfigError(f"dtype '{dtype}' is not supported; use one of auto, {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def _shared_reference(rows: list) -> tuple[bool, torch.Tensor | None]:
    """Whether every row has the same ICL reference codes (or every row none), and those codes."""
    first = rows[0].prompt.ref_codes
    for row in rows[1:]:
        ref = row.prompt.ref_codes
        if ref is first:
            continue
        if ref is None or first is None or ref.shape != first.shape or not torch.equal(ref, first):
            return False, None
    return True, first


def _pad_rows(waves: list, lengths: list) -> torch.Tensor:
    """Per-take CPU audio of `lengths` frames each -> [takes, T_max] float32, zero-padded."""
    samples = [n * SAMPLES_PER_FRAME for n in lengths]
    out = torch.zeros(len(waves), max(samples, default=0))
    for i, (wav, n) in enumerate(zip(waves, samples)):
        out[i, :n] = wav[:n]
    return out


class Engine:
    """Load once, then generate(), stream() and extract_voice() as often as needed. Calls are serialised
    (engine_lock.py): a second thread waits at most `busy_timeout_s` seconds, then gets EngineBusyError."""

    busy_timeout_s: float | None = 600.0

    def __init__(self, *, cfg, defaults, tokenizer, talker, speaker_encoder, codec, device, dtype,
                 info, max_takes, max_seq_len, warm_takes=1):
        self.cfg = cfg
        self.talker, self.speaker_encoder, self.codec = talker, speaker_encoder, codec
        self.device, self.dtype, self.info = device, dtype, info
        self.max_takes, self.max_seq_len = max_takes, max_seq_len
        self.warm_takes = warm_takes
        self.defaults = SamplingParams.from_generation_config(defaults)
        self.builder = PromptBuilder(cfg, talker, tokenizer)
        self.runner = EagerFrames(talker)
        self.codec_graphs = None  # gpu.codec_graph.CodecGraphs while CUDA graphs are on
        self._lock = EngineLock()

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, model_dir, device="auto", dtype="auto", cuda_graphs="auto", triton="auto",
             max_takes: int = 16, max_seq_len: int = 4096, codec_dir=None, warm_takes: int = 1) -> Engine:
        """Load a checkpoint folder. codec_dir: a codec folder (or a checkpoint folder with speech_tokenizer/)
        to use instead of the checkpoint's own; without it a folder that has no speech_tokenizer/ borrows the
        codec of a compatible checkpoint next to it. info.codec_dir / info.codec_origin say which was used.
        warm_takes: with CUDA graphs, the graphs of this many rows (takes) are captured at load besides one
        take's, and a call of up to this many rows runs on them: no request pays a capture (a larger count
        captures its own before its first request). Each row holds its own K/V cache (~0.47 GB at 4096
        positions)."""
        from .checkpoint.loader import load_components

        for name, value in (("cuda_graphs", cuda_graphs), ("triton", triton)):
            if value not in SWITCHES:
                raise UnsupportedConfigError(f"{name} must be one of {', '.join(SWITCHES)} (got '{value}').")
        if not 1 <= max_takes <= 16:
            raise InvalidInputError(f"max_takes must be between 1 and 16 (got {max_takes}).")
        checks.whole_number("warm_takes", warm_takes, 1, max_takes, "It cannot exceed max_takes.")
        dev = _resolve_device(device)
        dt = _resolve_dtype(dtype, dev)
        if cuda_graphs == "on" and dev.type != "cuda":
            raise UnsupportedConfigError("CUDA graphs need a CUDA device; set cuda_graphs to auto or off, or use device cuda.")
        from . import kernels

        try:
            ks, kernel_note = kernels.select(triton, dev)
        except kernels.KernelUnavailableError as exc:
            raise UnsupportedConfigError(f"{exc}. Set Triton kernels to auto or off.") from exc
        notes = [kernel_note]
        t0 = time.perf_counter()
        graphs = dev.type == "cuda" and cuda_graphs != "off"
        early = {"reserved": torch.cuda.memory_reserved(dev) if graphs else 0}

        def codec_loaded(decoder) -> None:  # while the talker's weights are read
            if dev.type == "cuda" and ks:  # the codec's SnakeBeta activations (CUDA inputs only), before capture
                decoder.use_kernels(ks)
            if graphs:
                from .gpu.codec_graph import CodecGraphs

                early["codec"] = CodecGraphs(decoder)
                # every decode of one take, or of up to warm_takes rows (any length, any chunk), replays these
                early["codec"].precapture_beside(warm_buckets(warm_takes))

        try:
            parts = load_components(Path(model_dir), dev, dt, None if codec_dir is None else Path(codec_dir),
                                    codec_loaded=codec_loaded)
        except BaseException:
            if "codec" in early:  # its thread must not outlive the load that started it
                with contextlib.suppress(Exception):
                    early["codec"].release()
            raise
        cfg: ModelConfig = parts["config"]
        source = parts["codec_source"]
        if source.origin != "own":
            notes.append(source.describe())
        info = EngineInfo(model_dir=str(model_dir), model_type=cfg.tts_model_type, model_size=cfg.tts_model_size,
                          device=str(dev), dtype=str(dt).replace("torch.", ""), notes=notes,
                          codec_dir=str(source.path), codec_origin=source.origin)
        engine = cls(cfg=cfg, defaults=parts["defaults"], tokenizer=parts["tokenizer"],
                     talker=parts["talker"], speaker_encoder=parts["speaker_encoder"], codec=parts["codec"],
                     device=dev, dtype=dt, info=info, max_takes=max_takes, max_seq_len=max_seq_len,
                     warm_takes=warm_takes)
        if graphs:  # the graphs' memory: what the load reserved beyond the weights
            weights = sum(t.numel() * t.element_size() for m in (engine.talker, engine.speaker_encoder, engine.codec)
                          if m is not None for t in [*m.parameters(), *m.buffers()])
            engine._enable_graphs(forced=cuda_graphs == "on", kernels=ks, codec=early["codec"],
                                  reserved_before=early["reserved"] + weights)
        else:
            notes.append(f"CUDA graphs: off ({'CPU' if dev.type == 'cpu' else 'cuda_graphs=off'})")
            if ks:  # the kernels live in the fused single-token path: run it uncaptured
                from .gpu.frame_graph import GraphedFrames

                engine.runner = GraphedFrames(engine.talker, max_seq_len, capture=False, kernels=ks)
        engine.info.kernels = list(engine.runner.active_kernels)
        log.info("loaded %s in %.1f s: %s", model_dir, time.perf_counter() - t0, info.summary())
        return engine

    def _enable_graphs(self, forced: bool, kernels, codec, reserved_before: int) -> None:
        """Switch to whole-frame CUDA graphs and codec piece graphs, capturing what requests will replay
        (proving capture works) at load. `codec`: the CodecGraphs whose one-take pieces Engine.load started
        capturing beside the talker's loading; `reserved_before`: the device memory (bytes) reserved without
        any graph, for the note on the graphs' memory."""
        from .gpu.frame_graph import GraphedFrames

        graphed = GraphedFrames(self.talker, self.max_seq_len, kernels=kernels)
        eager = self.runner
        self.runner, self.codec_graphs = graphed, codec
        try:
            self._warmup()
        except Exception as exc:  # capture failed: say so once and keep running eagerly
            self.runner, self.codec_graphs = eager, None
            graphed.release()
            codec.release()
            if forced:
                raise UnsupportedConfigError(f"CUDA graph capture failed ({type(exc).__name__}: {exc}).") from exc
            without = " without the Triton kernels" if kernels else ""  # EagerFrames runs torch ops only
            msg = f"CUDA graphs: capture failed ({type(exc).__name__}: {exc}); running eagerly{without}"
            log.warning(msg)
            self.info.notes.append(msg)
            return
        self.info.cuda_graphs = True
        pre = graphed.prefill_graphs
        prefill_note = (f"prefill graphs for prompts up to {max(pre.buckets)} tokens in {pre.capture_seconds:.2f} s"
                        if pre is not None else "no prefill graphs")
        # Captures no longer empty the memory cache before each graph (engine/gpu/capture.py): the warm-ups'
        # transient blocks go back to the device once, here. What stays is the graphs' pools and static buffers.
        torch.cuda.empty_cache()
        self.info.graph_bytes = max(torch.cuda.memory_reserved(self.device) - reserved_before, 0)
        taken = self.info.graph_bytes / 1e9
        rows = " and ".join(str(b) for b in warm_buckets(self.warm_takes))
        self.info.notes.append(f"CUDA graphs: on ({len(graphed.graphs)} frame graphs of {rows} rows, "
                               f"{graphed.reach}, in {graphed.capture_seconds:.2f} s; {prefill_note}; graphs and "
                               f"their static buffers take {taken:.2f} GB)")
        if codec.failure is not None:  # CodecGraphs logged the warning; the frame graphs stay on
            self.codec_graphs = None
            codec.release()
            if forced:
                raise UnsupportedConfigError(f"codec CUDA graph capture failed ({codec.failure}).")
            self.info.notes.append(f"codec CUDA graphs: capture failed ({codec.failure}); the codec decodes eagerly")
            return
        self.info.notes.append(f"codec CUDA graphs: on ({codec.captures} piece graphs of 1-32 frames for {rows} rows "
                               f"captured beside the talker's loading, a thread for each row count, "
                               f"{codec.capture_seconds:.2f} s of captures in all; up to "
                               f"{self.warm_takes} takes run on these, more capture theirs before their first "
                               "request decodes)")

    def _warmup(self) -> None:
        mode = MODE_OF_MODEL[self.cfg.tts_model_type]
        if mode == "clone":
            voice = Voice(spk_embedding=torch.zeros(self.cfg.embedding_width, dtype=self.dtype),
                          model_size=self.cfg.tts_model_size)
            req = Request(mode=mode, text="Warm up.", voice=voice)
        else:
            req = Request(mode=mode, text="Warm up.", speaker=(self.speakers or [None])[0], instruct="")
        # A checkpoint's min_new_tokens may exceed the 2 warm-up frames; validation must not fail the capture.
        warm = self.defaults.replace(max_new_tokens=2, min_new_tokens=min(self.defaults.min_new_tokens, 2))
        prompt, params, max_frames = self._prepare(req, 1, warm)
        for _ in self._frames(prompt, 1, 0, params, max_frames, 0, 0, None, None):
            pass
        buckets = warm_buckets(self.warm_takes)
        precapture = getattr(self.runner, "precapture", None)
        if callable(precapture):  # prefill buckets, and the frame graphs of common windows at one take and warm_takes
            precapture(buckets, PRECAPTURE_WINDOW)
        if self.codec_graphs is not None:  # every decode of up to warm_takes rows (any length, any chunk) replays these
            self.codec_graphs.precapture(buckets)
            # Each path a request takes pays its own first-run costs here (its side streams, the first launch
            # of each of its ops), not in the first request: a stream's first audio took 53 ms against 13 for
            # the next ones before it was warmed (bench/results/real_length_h100_0.6b_c40ba0f.json, stream2,
            # request 0); unwarmed, the first generate still cost ~5 ms more than the next and the Stream
            # node's first request ~7 ms more, first audio 19 against 14 ms (stream_ahead_h100/rl, request 0).
            # The nodes call generate_batch and stream_batch, the engine's own users generate and stream. The
            # shared one-take codec state is left fresh, as the capture left it.
            self.generate(req, params=warm)
            self.generate_batch([BatchItem(req)], params=warm)
            for _ in self.stream_batch([BatchItem(req)], params=warm, chunk_frames=2, first_chunk_frames=1):
                pass
            for _ in self.stream(req, params=warm, chunk_frames=1):
                pass
            if self.warm_takes > 1:  # the takes' own path: the prompt's K/V copied to every row, shared reads
                self.generate_batch([BatchItem(req, takes=self.warm_takes)], params=warm)
            for bucket in buckets:
                self.codec_graphs.state(bucket).zero_()

    # -- properties ----------------------------------------------------------------------------

    @property
    def model_type(self) -> str:
        return self.cfg.tts_model_type

    @property
    def speakers(self) -> list:
        return self.cfg.supported_speakers

    @property
    def languages(self) -> list:
        return self.cfg.supported_languages

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    # -- synthesis -----------------------------------------------------------------------------

    def _prepare(self, req: Request, takes: int, params: SamplingParams | None, take_offset: int = 0,
                 max_new_tokens: int | None = None, seed: int = 0):
        checks.whole_number("takes", takes, 1, self.max_takes,
                            "Load the model with a larger max_takes to generate more at once.")
        checks.whole_number("seed", seed, 0, SEED_MAX)
        check_take_range(take_offset, takes)
        if not checks.same_kind(req, Request):
            raise InvalidInputError(f"the request must be an engine Request (got {type(req).__name__}).")
        if params is not None and not checks.same_kind(params, SamplingParams):
            raise InvalidInputError(f"params must be a SamplingParams (got {type(params).__name__}); "
                                    "start from engine.defaults.replace(...).")
        params = params or self.defaults
        if max_new_tokens is not None:
            params = params.replace(max_new_tokens=max_new_tokens)  # validate() checks it
        params = params.validate()
        prompt = self.builder.build(req)
        length = prompt.prefill.shape[1]
        room = self.max_seq_len - length
        if room < 1:
            raise PromptTooLongError(
                f"the prompt is {length} tokens but the cache holds {self.max_seq_len}. Shorten the text "
                "(or the reference audio for ICL voices), or load the model with a larger max_seq_len."
            )
        max_frames = min(params.max_new_tokens, room)
        return prompt, params, max_frames

    def _frames(self, prompt: Prompt, takes, seed, params, max_frames, chunk_frames, take_offset, should_stop,
                on_progress, timings=None, first_chunk_frames=0, prelaunch=False, ahead=1):
        # On CUDA a prelaunching loop also keeps `ahead` frames queued across each chunk's host sync.
        return decode_frames(self.runner, prompt, takes=takes, seed=seed, params=params, max_frames=max_frames,
                             eos_id=self.cfg.talker.codec_eos_id, chunk_frames=chunk_frames, take_offset=take_offset,
                             should_stop=should_stop, on_frames=on_progress, timings=timings,
                             first_chunk_frames=first_chunk_frames, prelaunch=prelaunch,
                             ahead=ahead if prelaunch and self.device.type == "cuda" else 0)

    @serialised()
    @torch.inference_mode()
    def generate(self, req: Request, takes: int = 1, seed: int = 0, params: SamplingParams | None = None,
                 on_progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, take_offset: int = 0,
                 progress_every: int = 4) -> Result:
        """Synthesise `takes` takes of one request. Take i draws from stream (seed, take_offset + i)."""
        t0 = time.perf_counter()
        prompt, params, max_frames = self._prepare(req, takes, params, take_offset, seed=seed)
        timings = {}
        # prelaunch: no chunk's codec work has to come before the next frame on the stream (decode_rows)
        chunks = self._frames(prompt, takes, seed, params, max_frames, progress_every, take_offset, should_stop,
                              on_progress, timings, prelaunch=True)
        overlap = self._overlapped_decode(takes, prompt.ref_codes)
        host = HostAudio(takes, max_frames) if overlap is not None else None
        try:
            codes, lengths = collect(chunks if overlap is None else touching(overlap.tap(chunks),
                                                                             [(range(takes), host)]))
            t_decode = time.perf_counter()
            if overlap is not None:
                audio = self._trim(overlap.finish(), lengths, host)
            else:
                audio = self._codes_to_audio(codes, lengths, prompt.ref_codes)
        finally:
            if overlap is not None:
                overlap.release()
        wall = time.perf_counter() - t0
        frames = codes.shape[1]
        samples = [n * SAMPLES_PER_FRAME for n in lengths]
        stats = {"frames": frames, "prompt_tokens": prompt.prefill.shape[1], "frames_per_take": lengths,
                 "prefill_s": timings.get("prefill_s", 0.0), "decode_s": t_decode - t0, "codec_s": wall - (t_decode - t0), "wall_s": wall,
                 "audio_s": max(samples) / SAMPLE_RATE if samples else 0.0, "notes": prompt.notes,
                 "codec": "during decoding" if overlap is not None else "after decoding"}
        return Result(audio=audio, lengths=samples,
                      codes=[codes[i, :n].cpu() for i, n in enumerate(lengths)], stats=stats)

    def _batch_rows(self, items: list, params, caller: str):
        """Every take of every BatchItem as a decode Row (take i of item k draws from stream (seed,
        take_offset + i) with the item's own budget): (rows, each item's prompt, each item's row indices)."""
        for item in items:
            if not checks.same_kind(item, BatchItem):
                raise InvalidInputError(f"{caller} takes a list of BatchItem (got {type(item).__name__}).")
        rows, prompts, item_rows = [], [], []
        for item in items:
            prompt, _, max_frames = self._prepare(item.request, item.takes, params, item.take_offset,
                                                  item.max_new_tokens, seed=item.seed)
            prompts.append(prompt)
            guess = min(max_frames, expected_frames(item.request.text))
            keys = sampling.take_keys(item.seed, range(item.take_offset, item.take_offset + item.takes), "cpu")
            item_rows.append(list(range(len(rows), len(rows) + item.takes)))
            rows += [Row(prompt, key, max_frames, guess) for key in keys.tolist()]
        return rows, prompts, item_rows

    @serialised()
    @torch.inference_mode()
    def generate_batch(self, items: list, params: SamplingParams | None = None,
                       on_progress: Callable[[int, int], None] | None = None,
                       should_stop: Callable[[], bool] | None = None, max_rows: int | None = None,
                       chunk_frames: int = 4) -> list:
        """One Result per BatchItem, in order; item k equals generate() of that item alone.

        Every take of every item is one batch row; up to `max_rows` (default max_takes) rows decode at
        once, each with its own prompt, position, trailing text, stream and end. Every `chunk_frames`
        frames the finished rows free their slots and the next rows (longest text first) are prefilled
        into them. on_progress(frames_done, frames_total) counts frames over all rows (the total is an
        estimate until the rows end). Each Result's stats["batch"] holds the slot occupancy of the run, and
        stats["codec"] says whether the codec ran during decoding (every row in a slot from the start, one
        voice: the ComfyUI nodes' case) or after it.
        """
        t0 = time.perf_counter()
        items = list(items)
        if not items:
            return []
        max_rows = self.max_takes if max_rows is None else checks.whole_number("max_rows", max_rows, 1, self.max_takes)
        checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS, "4 frames is typical.")
        rows, prompts, item_rows = self._batch_rows(items, params, "generate_batch")
        # Longest first, so the short rows fill the tail; an item's takes stay together (one prefill).
        order = [r for k in sorted(range(len(items)), key=lambda k: -rows[item_rows[k][0]].expected)
                 for r in item_rows[k]]
        slots = min(max_rows, len(rows))
        # When every row holds its slot from the first frame to its end and all share one ICL reference (or
        # none), the codec decodes on a side stream while the frames run, as in generate(); otherwise (rows
        # waiting for a slot, several voices) it decodes the finished rows after the loop, by groups.
        shared, ref = _shared_reference(rows) if len(rows) <= slots else (False, None)
        overlap = self._overlapped_decode(slots, ref) if shared else None
        timings = {}
        chunks = decode_rows(self.runner, rows, slots=slots, params=(params or self.defaults).validate(),
                             eos_id=self.cfg.talker.codec_eos_id, chunk_frames=chunk_frames, order=order,
                             should_stop=should_stop, on_frames=on_progress, timings=timings, prelaunch=True,
                             ahead=1 if self.device.type == "cuda" else 0)
        codes, valid = [[] for _ in rows], [[] for _ in rows]
        slot_of = {}
        hosts = [HostAudio(len(mine), rows[mine[0]].max_frames) for mine in item_rows] if overlap is not None else []
        try:
            for chunk in chunks if overlap is None else touching(overlap.tap(chunks), list(zip(item_rows, hosts))):
                for slot, r in enumerate(chunk.rows):
                    if r >= 0:
                        slot_of[r] = slot
                        codes[r].append(chunk.codes[slot])
                        valid[r].append(chunk.valid[slot])
            lengths = [int(n) for n in torch.stack([torch.cat(v).sum() for v in valid]).tolist()]
            codes = [torch.cat(c)[:n] for c, n in zip(codes, lengths)]
            t_decode = time.perf_counter()
            if overlap is not None:
                wav = overlap.finish()  # [slots, frames * 1920] on the device, slot order
                audio = [self._slots_to_audio(wav, [slot_of[r] for r in mine], [lengths[r] for r in mine], host)
                         for mine, host in zip(item_rows, hosts)]
            else:
                by_row = self._rows_to_audio(codes, lengths, [r.prompt.ref_codes for r in rows], slots)
                audio = [_pad_rows([by_row[r] for r in mine], [lengths[r] for r in mine]) for mine in item_rows]
        finally:
            if overlap is not None:
                overlap.release()
        wall = time.perf_counter() - t0
        results = []
        for k, item in enumerate(items):
            mine = item_rows[k]
            n = [lengths[r] for r in mine]
            samples = [x * SAMPLES_PER_FRAME for x in n]
            stats = {"frames": max(n), "prompt_tokens": prompts[k].prefill.shape[1], "frames_per_take": n,
                     "prefill_s": timings.get("prefill_s", 0.0), "decode_s": t_decode - t0,
                     "codec_s": wall - (t_decode - t0), "wall_s": wall, "audio_s": max(samples) / SAMPLE_RATE,
                     "notes": prompts[k].notes, "batch": timings.get("batch", {}),
                     "codec": "during decoding" if overlap is not None else "after decoding"}
            results.append(Result(audio=audio[k], lengths=samples, codes=[codes[r].cpu() for r in mine],
                                  stats=stats))
        return results

    def _slots_to_audio(self, wav: torch.Tensor, slots: list, lengths: list, host: HostAudio) -> torch.Tensor:
        """Rows `slots` of the device audio [slots, samples] as one item's [takes, T_max] float32 CPU audio."""
        if slots == list(range(len(slots))):
            wav = wav[: len(slots)]
        else:  # the item's takes sit elsewhere in the batch: gather them
            wav = wav[torch.tensor(slots, device=wav.device)]
        return self._trim(wav, lengths, host)

    def _rows_to_audio(self, codes: list, lengths: list, refs: list, group: int) -> list:
        """Waveforms [frames * 1920] of many rows: rows with the same ICL reference (or none) are decoded
        together in groups of similar length (the codec is causal, so padding cannot change them)."""
        out = [torch.zeros(0)] * len(codes)
        by_ref = {}
        for r, ref in enumerate(refs):
            by_ref.setdefault(None if ref is None else id(ref), []).append(r)
        for members in by_ref.values():
            members.sort(key=lambda r: lengths[r])
            for i in range(0, len(members), group):
                part = [r for r in members[i: i + group] if lengths[r] > 0]
                if not part:
                    continue
                frames = max(lengths[r] for r in part)
                batch = torch.zeros(len(part), frames, codes[part[0]].shape[1], dtype=torch.long,
                                    device=codes[part[0]].device)
                for j, r in enumerate(part):
                    batch[j, : lengths[r]] = codes[r]
                wav = self._codes_to_audio(batch, [lengths[r] for r in part], refs[part[0]])
                for j, r in enumerate(part):
                    out[r] = wav[j, : lengths[r] * SAMPLES_PER_FRAME]
        return out

    @serialised_stream
    @torch.inference_mode()
    def stream(self, req: Request, takes: int = 1, seed: int = 0, params: SamplingParams | None = None,
               chunk_frames: int = 8, on_progress=None, should_stop=None, take_offset: int = 0,
               first_chunk_frames: int = 0) -> Iterator[AudioChunk]:
        """Yield audio chunk by chunk; the concatenation equals generate() with the same arguments.

        `first_chunk_frames` (1..chunk_frames, 0 = chunk_frames) makes the first chunk shorter, for earlier
        first audio; the audio is the same, only cut at different frames."""
        from .codec.streaming import StreamingDecoder

        checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
        checks.whole_number("first_chunk_frames", first_chunk_frames, 0, chunk_frames,
                            "0 makes the first chunk as long as the others; 2 gives the earliest first audio.")
        t0 = time.perf_counter()
        prompt, params, max_frames = self._prepare(req, takes, params, take_offset, seed=seed)
        decoder = StreamingDecoder(self.codec, batch=takes, graphs=self.codec_graphs)
        if prompt.ref_codes is not None:  # ICL: the reference codes are left context, never emitted
            decoder.prime(prompt.ref_codes)
        # With codec graphs, each chunk's codec runs on a side stream while the next chunk's first frame,
        # launched ahead, runs on the main one: the frames no longer wait for the codec and the host copy.
        side = torch.cuda.Stream(self.device) if self.codec_graphs is not None else None
        chunks = self._frames(prompt, takes, seed, params, max_frames, chunk_frames, take_offset, should_stop,
                              on_progress, first_chunk_frames=first_chunk_frames, prelaunch=side is not None,
                              ahead=STREAM_AHEAD)
        for i, chunk in enumerate(chunks):
            with chunk.on(side):
                codes = chunk.codes.masked_fill(~chunk.valid[..., None], 0)
                wav = decoder.push(codes).float()
                ends = chunk.valid.sum(1, keepdim=True) * SAMPLES_PER_FRAME
                wav = (wav * (torch.arange(wav.shape[1], device=wav.device)[None] < ends)).cpu()  # syncs this stream
                valid, codes = ends[:, 0].tolist(), chunk.codes.cpu()
            yield AudioChunk(audio=wav, valid=[int(v) for v in valid], codes=codes, index=i,
                             elapsed_s=time.perf_counter() - t0, final=chunk.done)

    @serialised_stream
    @torch.inference_mode()
    def stream_batch(self, items: list, params: SamplingParams | None = None, chunk_frames: int = 8,
                     first_chunk_frames: int = 0, max_rows: int | None = None, on_progress=None,
                     should_stop=None) -> Iterator[RowChunk]:
        """Stream many requests at once: every take of every BatchItem is a row of one decode loop (as in
        generate_batch), and each row's audio is yielded as a RowChunk tagged (item, take) as soon as its
        chunk is decoded. Each take's chunks, concatenated, equal that take of generate_batch / generate alone.

        Rows enter in item order (item 0 first) and up to `max_rows` (default max_takes) decode at once; a
        finished row frees its slot for the next at a chunk boundary. With `first_chunk_frames` set, the
        first chunk is that short and only item 0's takes are prefilled before it (the others join after
        it), so item 0's first audio comes as early as from stream(). Each row's codec state is its own
        (codec/row_streams.py). Closing the generator early frees the engine and every row's state."""
        items = list(items)
        if not items:
            return
        max_rows = self.max_takes if max_rows is None else checks.whole_number("max_rows", max_rows, 1, self.max_takes)
        checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
        checks.whole_number("first_chunk_frames", first_chunk_frames, 0, chunk_frames,
                            "0 makes the first chunk as long as the others; 2 gives the earliest first audio.")
        t0 = time.perf_counter()
        rows, _, item_rows = self._batch_rows(items, params, "stream_batch")
        tag = [(k, i) for k, mine in enumerate(item_rows) for i in range(len(mine))]
        slots = min(max_rows, len(rows))
        lead = min(len(item_rows[0]), slots) if first_chunk_frames > 0 else 0
        from .codec.row_streams import RowStreams

        streams = RowStreams(self.codec.decoder, self.codec_graphs)
        # With codec graphs, as in stream(): each chunk's codecs and copies run on a side stream while the next
        # chunk's first frame, launched ahead, runs on the main one, and the host syncs only the side stream.
        side = torch.cuda.Stream(self.device) if self.codec_graphs is not None else None
        chunks = decode_rows(self.runner, rows, slots=slots, params=(params or self.defaults).validate(),
                             eos_id=self.cfg.talker.codec_eos_id, chunk_frames=chunk_frames,
                             should_stop=should_stop, on_frames=on_progress, first_chunk_frames=first_chunk_frames,
                             lead_rows=lead, prelaunch=side is not None, ahead=STREAM_AHEAD if side is not None else 0)
        count = [0] * len(rows)
        try:
            for chunk in chunks:
                out = []
                with chunk.on(side):
                    real = chunk.valid.sum(1).tolist()  # a row's real frames are a prefix of its chunk
                    codes_host = chunk.codes.cpu()
                    for slot, r in enumerate(chunk.rows):
                        if r < 0:
                            continue
                        if count[r] == 0:
                            streams.open(r, rows[r].prompt.ref_codes)
                        n = real[slot]
                        wav = streams.push(r, chunk.codes[slot, :n]).float().cpu() if n else torch.zeros(0)
                        final = r in chunk.ended
                        if final:
                            streams.close(r)
                        k, i = tag[r]
                        out.append(RowChunk(item=k, take=i, audio=wav, codes=codes_host[slot, :n], index=count[r],
                                            final=final, elapsed_s=time.perf_counter() - t0))
                        count[r] += 1
                yield from out  # after the block: the consumer runs on the main stream
        finally:
            chunks.close()  # the loop first, then the codec states it fed
            if side is not None:
                torch.cuda.current_stream(self.device).wait_stream(side)
            streams.release()

    def _overlapped_decode(self, takes: int, ref_codes):
        """The codec decode that runs on a side stream while frames are generated (engine/gpu/codec_overlap.py),
        or None: no codec graphs, or a live stream holds the state of this takes bucket."""
        if self.codec_graphs is None:
            return None
        from .gpu.codec_overlap import OverlappedDecode

        overlap = OverlappedDecode(self.codec_graphs, takes, ref_codes)
        return overlap if overlap.active else None

    @staticmethod
    def _trim(wav: torch.Tensor, lengths: list, host: HostAudio | None = None) -> torch.Tensor:
        """[B, samples] on any device -> float32 CPU, zero past each take's `lengths` frames (into `host`'s
        resident memory when given, engine/host_audio.py).

        The cut and the zeroing run where the audio is, and the result crosses to the host in one copy: CPU
        tensor ops here woke torch's intra-op thread pool, which cost up to 11 ms after the GPU was done
        (bench/request_timeline.py, H200)."""
        samples = torch.tensor(lengths, device=wav.device) * SAMPLES_PER_FRAME
        wav = wav[:, : max(lengths, default=0) * SAMPLES_PER_FRAME].float()
        keep = torch.arange(wav.shape[1], device=wav.device)[None] < samples[:, None]
        wav = wav.masked_fill(~keep, 0.0)
        return wav.cpu() if host is None else host.take(wav)

    def _codes_to_audio(self, codes: torch.Tensor, lengths: list, ref_codes: torch.Tensor | None) -> torch.Tensor:
        """Decode [B, T, 16] codes; frames past a take's end are zeroed first (the codec is causal, so
        they cannot change earlier samples) and their samples dropped."""
        takes, frames = codes.shape[0], codes.shape[1]
        keep = torch.arange(frames, device=codes.device)[None] < torch.tensor(lengths, device=codes.device)[:, None]
        codes = codes.masked_fill(~keep[..., None], 0)
        wav = None
        if self.codec_graphs is not None and frames > 0:  # piece graphs: any length, ICL prefix cached
            self.codec.decoder.check_codes(codes.transpose(1, 2))
            wav = self.codec_graphs.decode_utterance(codes, ref_codes)
        if wav is None:
            ref = 0
            if ref_codes is not None:
                ref = ref_codes.shape[0]
                codes = torch.cat([ref_codes[None].expand(takes, -1, -1).to(codes.device), codes], 1)
            wav = self.codec.decode(codes)[:, ref * SAMPLES_PER_FRAME:]
        return self._trim(wav, lengths)

    # -- voices --------------------------------------------------------------------------------

    @serialised()
    @torch.inference_mode()
    def extract_voice(self, waveform, sample_rate: int, ref_text: str | None = None) -> Voice:
        """Speaker embedding (and, with ref_text, ICL reference codes) from any mono or multi-channel audio."""
        from . import audio

        if self.speaker_encoder is None:
            raise ModeError(
                f"this is a {self.cfg.tts_model_type} checkpoint; only Base checkpoints can extract voices. "
                "Load a Qwen3-TTS-12Hz Base model for voice cloning."
            )
        checks.text_value("ref_text", ref_text, optional=True)
        wav24 = audio.prepare_reference(waveform, sample_rate, SAMPLE_RATE)
        emb = self.speaker_encoder.embed(wav24)
        codes = None
        text = None
        if ref_text is not None and ref_text.strip():
            text = ref_text.strip()
            codes = self.codec.encoder.encode(wav24[None].to(self.device))[0].cpu()
        return Voice(spk_embedding=emb.detach().cpu(), model_size=self.cfg.tts_model_size, ref_codes=codes,
                     ref_text=text)

    def check_voice(self, voice: Voice) -> None:
        voice.check_compatible(self.cfg)

    # -- memory --------------------------------------------------------------------------------

    @serialised()
    def release(self) -> None:
        """Free device memory: graphs and caches are dropped and weights move to the CPU (load the engine
        again to run on the GPU)."""
        release_graphs = getattr(self.runner, "release", None)
        if callable(release_graphs):
            release_graphs()
        if self.codec_graphs is not None:
            self.codec_graphs.release()
            self.codec_graphs = None
        self.runner = EagerFrames(self.talker)
        self.info.cuda_graphs = False
        for m in (self.talker, self.speaker_encoder, self.codec):
            if m is not None:
                m.to("cpu")
        self.builder.forget()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.device = torch.device("cpu")
        self.info.device = "cpu (released)"
