"""Run a request through the engine from a node: segments, progress, interrupt, errors -> AUDIO.

Engine-facing only through docs/ENGINE_API.md: Request, BatchItem, SamplingParams.replace, generate and
stream. Long text is split into segments that decode as rows of one batch (generate, or stream
when streaming), each row equal to that segment generated alone, and are joined in order.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

import comfy.model_management as mm
import comfy.utils

from ..engine.remote.config import RemoteConfig
from . import engine_cache
from .common import MAX_SEGMENT_CHARS, MIN_SEGMENT_CHARS, SEED_MAX
from .audio_utils import make_audio, play_order, results_audio
from .sampling import sampling_changes, with_changes
from .text_split import DEFAULT_MAX_UNITS, PROMPT_OVERHEAD, segment_budget, split_text


def _engine_api():
    from ..engine import Request, check_take_range, errors
    return Request, errors, check_take_range


def _batch_item():
    from ..engine import BatchItem
    return BatchItem


def _checks():
    from ..engine import checks
    return checks


@contextlib.contextmanager
def engine_errors(label: str):
    """Map the engine's typed errors to what ComfyUI expects: its interrupt, or a RuntimeError naming the node."""
    _, errors, _ = _engine_api()
    try:
        yield
    except errors.GenerationInterrupted:
        mm.throw_exception_if_processing_interrupted()
        raise mm.InterruptProcessingException()
    except errors.Qwen3TTSError as exc:
        raise RuntimeError(f"{label}: {exc}") from exc


def _voice_overhead(voice) -> int:
    """Extra prompt positions an ICL voice occupies (reference codes + at most one per reference-text char)."""
    if not getattr(voice, "is_icl", False):  # None, an x-vector voice, or a wrong type the engine refuses
        return 0
    return int(voice.ref_codes.shape[0]) + len(voice.ref_text or "")


FIRST_CHUNK_FRAMES = 2


class Job:
    """Everything a generator node asked for, resolved against the engine."""

    def __init__(self, node: str, ref, mode: str, text: str, language: str, speaker=None, instruct=None,
                 voice=None, seed: int = 0, takes: int = 1, first_take: int = 0,
                 max_segment_chars: int = DEFAULT_MAX_UNITS, **widgets):
        self.node = node
        _, errors, check_take_range = _engine_api()
        checks = _checks()
        try:  # every check that needs no weights runs before the engine is (re)loaded, with the engine's checks
            changes = sampling_changes(**widgets)
            where = ("The server's --max-takes is the most; start it with a larger one."
                     if isinstance(ref.key, RemoteConfig) else "Raise max_takes on LoadQwen3TTS.")
            checks.whole_number("takes", takes, 1, ref.key.max_takes, where)
            checks.whole_number("seed", seed, 0, SEED_MAX)
            check_take_range(first_take, takes)
            checks.whole_number("max_segment_chars", max_segment_chars, MIN_SEGMENT_CHARS, MAX_SEGMENT_CHARS)
            checks.text_value("text", text)
        except ValueError as exc:  # the engine's InvalidInputError is a ValueError too
            raise errors.InvalidInputError(f"{node}: {exc}") from exc
        budget = segment_budget(max_segment_chars, ref.key.max_seq_len, PROMPT_OVERHEAD + _voice_overhead(voice))
        self.segments = split_text(text, budget, check=mm.throw_exception_if_processing_interrupted)
        if not self.segments:
            raise errors.InvalidInputError(f"{node}: the text is empty; type the words to speak.")
        self.engine = engine_cache.acquire(ref.key)
        self.params = with_changes(self.engine.defaults, changes)
        self.mode, self.language, self.speaker, self.instruct, self.voice = mode, language, speaker, instruct, voice
        self.seed, self.takes, self.first_take = seed, takes, first_take
        self.pbar = comfy.utils.ProgressBar(1)

    def _report(self, value: int, maximum: int) -> None:
        self.pbar.update_absolute(value, maximum)
        mm.throw_exception_if_processing_interrupted()

    def request(self, k: int):
        Request, _, _ = _engine_api()
        # The engine normalises case, blanks and an empty instruct itself.
        return Request(mode=self.mode, text=self.segments[k], language=self.language, speaker=self.speaker,
                       voice=self.voice, instruct=self.instruct)

    def origin(self) -> dict:
        """Where the takes come from: take i is stream (seed, first_take + i) of every text segment."""
        return {"node": self.node, "seed": self.seed, "first_take": self.first_take}

    def seed_for(self, k: int) -> int:
        return (self.seed + k) % (1 << 64)

    def call(self, fn: Callable):
        """Run one engine call; map interrupts and typed engine errors to what ComfyUI expects."""
        mm.throw_exception_if_processing_interrupted()
        with engine_errors(self.node):
            return fn()

    def generate(self) -> dict:
        """Every segment (times its takes) is a row of one batch; progress counts frames over all rows.
        Take i of every segment draws from stream (seed_for(k), first_take + i), as generated alone."""
        BatchItem = _batch_item()
        items = [BatchItem(self.request(k), takes=self.takes, seed=self.seed_for(k), first_take=self.first_take)
                 for k in range(len(self.segments))]
        results = self.call(lambda: self.engine.generate(
            items, params=self.params, on_progress=self._report, should_stop=mm.processing_interrupted))
        return results_audio(results, self.engine.sample_rate, self.origin())

    def stream(self, chunk_frames: int, send: Callable[[dict], None]) -> dict:
        """Stream one take of every segment; `send` gets the audio in order as soon as it can be played.
        The segments decode as rows of one stream (take 0 of segment k draws from stream
        (seed_for(k), first_take), as generated alone): segment 1's chunks are sent as they come, a later
        segment's are held until every earlier one has ended. Returns the full AUDIO (segments joined)."""
        BatchItem = _batch_item()
        n = len(self.segments)
        sr = self.engine.sample_rate
        pieces, sent, t0 = [], 0, time.perf_counter()
        ttfa = None

        def emit(x):
            nonlocal sent, ttfa
            if x.numel() == 0:
                return
            elapsed = time.perf_counter() - t0
            ttfa = elapsed if ttfa is None else ttfa
            pieces.append(x)
            sent += x.numel()
            send({"phase": "chunk", "seq": len(pieces) - 1, "samples": int(x.numel()), "pcm": x,
                  "elapsed_s": elapsed, "audio_s": sent / sr, "ttfa_s": ttfa})

        send({"phase": "start", "sample_rate": sr, "segments": n, "chunk_frames": chunk_frames})
        # The first chunk is 2 frames whatever the chunk size: the earliest first audio, the same samples.
        first_chunk = FIRST_CHUNK_FRAMES if isinstance(chunk_frames, int) and chunk_frames > FIRST_CHUNK_FRAMES else 0
        items = [BatchItem(self.request(k), takes=1, seed=self.seed_for(k), first_take=self.first_take)
                 for k in range(n)]

        def run():
            # closing(): an interrupt raised here must end the generator (and free the engine) now, not
            # when the traceback that still references it is collected.
            with contextlib.closing(self.engine.stream(
                    items, params=self.params, chunk_frames=chunk_frames, first_chunk_frames=first_chunk,
                    on_progress=self._report, should_stop=mm.processing_interrupted)) as chunks:
                for _, ready in play_order(chunks, n, sr):  # segment 1 as it comes, later ones held for their turn
                    for x in ready:
                        emit(x)
                    mm.throw_exception_if_processing_interrupted()
        self.call(run)
        wav = torch.cat(pieces) if pieces else torch.zeros(0)
        elapsed = time.perf_counter() - t0
        send({"phase": "end", "chunks": len(pieces), "samples": int(wav.numel()), "elapsed_s": elapsed,
              "ttfa_s": ttfa, "rtf": (wav.numel() / sr) / max(elapsed, 1e-9)})  # x real time, as the engine
        return make_audio(wav.unsqueeze(0), [wav.numel()], sr, self.origin(), copy=False)  # ours: no copy
