"""The Engine: a loaded checkpoint that turns requests into audio.

Two entry points, `generate` and `stream`, each taking one Request (with its takes, seed and first take) or a
list of BatchItems. Both run the one decode loop (decode.py) and the one audio path (codec_session.py), so
the chunks of a stream, joined, equal what generate returns.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

import torch

from . import checks, sampling
from .callbacks import guarded
from .codec_session import CodecSession
from .config import SAMPLE_RATE, SAMPLES_PER_FRAME
from .decode import EagerFrames, Row, decode_rows
from .engine_config import EngineConfig
from .engine_lock import EngineLock, serialised, serialised_stream
from .errors import InvalidInputError, ModeError, PromptTooLongError
from .host_audio import HostAudio, touching
from .limits import SEED_MAX
from .prompt import Prompt, PromptBuilder, Request, expected_frames
from .sampling import MAX_NEW_TOKENS, SamplingParams, check_take_range
from .voice import REF_TEXT_HINT, Voice

# Frames a stream keeps queued on the GPU while the host waits for each chunk's audio and hands it on: with
# one, the frames' stream sat idle part of every chunk. A stream ended by EOS drops up to this many frames.
STREAM_AHEAD = 2


@dataclass
class BatchItem:
    """One request of a list: take i draws from random stream (seed, first_take + i), so an item's result
    equals the same request generated alone. max_new_tokens, if set, is this item's own frame budget."""

    request: Request
    takes: int = 1
    seed: int = 0
    first_take: int = 0
    max_new_tokens: int | None = None


@dataclass
class Result:
    audio: torch.Tensor  # [takes, T_max] float32 CPU, zero-padded
    lengths: list  # samples per take
    codes: list  # LongTensor [frames_i, 16] per take
    sample_rate: int = SAMPLE_RATE
    stats: dict = field(default_factory=dict)


@dataclass
class Chunk:
    """New audio of one take of one item, from Engine.stream."""

    item: int  # index into the items (0 for a single request)
    take: int  # 0 .. takes - 1 (random stream first_take + take)
    audio: torch.Tensor  # [k * 1920] float32 CPU: the take's next k frames (k may be 0 at its end)
    codes: torch.Tensor  # [k, 16] those frames, CPU
    index: int  # 0, 1, 2, ... for this take
    final: bool  # the take's last chunk
    elapsed_s: float  # since the call started


def as_items(what, takes: int, seed: int, first_take: int, caller: str) -> tuple[list, bool]:
    """A call's Request (with its takes, seed and first_take) or list of BatchItem, as the list of items;
    and whether it was one Request."""
    if checks.same_kind(what, Request):
        return [BatchItem(what, takes=takes, seed=seed, first_take=first_take)], True
    if isinstance(what, (list, tuple)):
        if (takes, seed, first_take) != (1, 0, 0):
            raise InvalidInputError(f"{caller}: with a list of BatchItem, takes, seed and first_take are set "
                                    "on each item.")
        for item in what:
            if not checks.same_kind(item, BatchItem):
                raise InvalidInputError(f"{caller} takes a Request or a list of BatchItem "
                                        f"(got a list holding {type(item).__name__}).")
        return list(what), False
    raise InvalidInputError(f"{caller} takes a Request or a list of BatchItem (got {type(what).__name__}).")


def _shared_reference(rows: list) -> bool:
    """Whether every row has the same ICL reference codes (or every row none)."""
    first = rows[0].prompt.ref_codes
    for row in rows[1:]:
        ref = row.prompt.ref_codes
        if ref is first:
            continue
        if ref is None or first is None or ref.shape != first.shape or not torch.equal(ref, first):
            return False
    return True


def _trim(wav: torch.Tensor, frames: list, host: HostAudio | None = None) -> torch.Tensor:
    """[B, samples] on any device -> float32 CPU, zero past each row's `frames`, in one copy to the host (into
    `host`'s resident memory when given). The cut runs where the audio is: CPU tensor ops here would wake
    torch's intra-op thread pool after the GPU is done."""
    ends = torch.tensor(frames, device=wav.device) * SAMPLES_PER_FRAME
    wav = wav[:, : max(frames, default=0) * SAMPLES_PER_FRAME].float()
    keep = torch.arange(wav.shape[1], device=wav.device)[None] < ends[:, None]
    wav = wav.masked_fill(~keep, 0.0)
    return wav.cpu() if host is None else host.take(wav)


class Engine:
    """Load once (`Engine.load`), then generate(), stream() and extract_voice() as often as needed. Calls are
    serialised (engine_lock.py): a second thread waits at most `busy_timeout_s` seconds, then gets
    EngineBusyError."""

    busy_timeout_s: float | None = 600.0

    def __init__(self, *, config: EngineConfig, cfg, defaults, tokenizer, talker, speaker_encoder, codec, device,
                 dtype, info):
        self.config, self.cfg = config, cfg
        self.talker, self.speaker_encoder, self.codec = talker, speaker_encoder, codec
        self.device, self.dtype, self.info = device, dtype, info
        self.defaults = SamplingParams.from_generation_config(defaults)
        self.builder = PromptBuilder(cfg, talker, tokenizer)
        self.runner = EagerFrames(talker)
        self.codec_graphs = None  # gpu.codec_graph.CodecGraphs while CUDA graphs are on
        self._lock = EngineLock()

    @classmethod
    def load(cls, config: EngineConfig | str, **options) -> Engine:
        """Load a checkpoint: `Engine.load(EngineConfig(...))`, or `Engine.load(folder, **fields)` for short."""
        from .loading import load_engine

        if not isinstance(config, EngineConfig) and not isinstance(config, (str, bytes)) \
                and not hasattr(config, "__fspath__"):
            raise InvalidInputError(f"Engine.load takes an EngineConfig or a folder (got {type(config).__name__}).")
        known = [f.name for f in fields(EngineConfig) if isinstance(config, EngineConfig) or f.name != "model_dir"]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InvalidInputError(f"Engine.load has no option {', '.join(unknown)}; its options are "
                                    f"{', '.join(known)} (the fields of EngineConfig).")
        if not isinstance(config, EngineConfig):
            config = EngineConfig(model_dir=config, **options)
        elif options:
            config = config.replace(**options)
        return load_engine(cls, config)

    @property
    def max_takes(self) -> int:
        return self.config.max_takes

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

    # -- requests -> rows ----------------------------------------------------------------------

    def prepare(self, req: Request, takes: int, params: SamplingParams | None, first_take: int = 0,
                max_new_tokens: int | None = None, seed: int = 0) -> tuple[Prompt, SamplingParams, int]:
        """Check one request and build its prompt: (prompt, params, frame budget)."""
        checks.whole_number("takes", takes, 1, self.max_takes, f"This model was loaded with max_takes "
                            f"{self.max_takes}; load it with a larger max_takes to generate more at once.")
        checks.whole_number("seed", seed, 0, SEED_MAX)
        check_take_range(first_take, takes)
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
        room = self.config.max_seq_len - length
        if room < 1:
            raise PromptTooLongError(
                f"the prompt is {length} tokens but the cache holds {self.config.max_seq_len}. Shorten the text "
                "(or the reference audio for ICL voices), or load the model with a larger max_seq_len."
            )
        return prompt, params, min(params.max_new_tokens, room)

    def _rows(self, items: list, params) -> tuple[list, list, list]:
        """Every take of every item as a decode Row: (rows, each item's prompt, each item's row indices)."""
        rows, prompts, item_rows = [], [], []
        for item in items:
            prompt, _, max_frames = self.prepare(item.request, item.takes, params, item.first_take,
                                                 item.max_new_tokens, seed=item.seed)
            prompts.append(prompt)
            guess = min(max_frames, expected_frames(item.request.text))
            keys = sampling.take_keys(item.seed, range(item.first_take, item.first_take + item.takes), "cpu")
            item_rows.append(list(range(len(rows), len(rows) + item.takes)))
            rows += [Row(prompt, key, max_frames, guess) for key in keys.tolist()]
        return rows, prompts, item_rows

    def _max_rows(self, max_rows) -> int:
        return self.max_takes if max_rows is None else checks.whole_number("max_rows", max_rows, 1, self.max_takes)

    def _session(self, refs, together: bool, stream: bool, slots: int | None = None) -> CodecSession:
        """The codec session of one loop of `slots` slots; `refs`: each row's ICL reference codes (a list, or a
        dict by row id that grows while the loop runs, as the scheduler's does). With graphs its codec works on
        a side stream."""
        side = torch.cuda.Stream(self.device) if self.codec_graphs is not None else None
        return CodecSession(self.codec.decoder, self.codec_graphs, refs, together=together, stream=stream, side=side,
                            slots=slots, invariant=self.config.batch_invariant)

    # -- synthesis -----------------------------------------------------------------------------

    @serialised()
    @torch.inference_mode()
    def generate(self, what: Request | list, *, takes: int = 1, seed: int = 0, first_take: int = 0,
                 params: SamplingParams | None = None, on_progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, max_rows: int | None = None,
                 chunk_frames: int = 4) -> Result | list:
        """Synthesise a Request (-> Result of `takes` takes) or a list of BatchItem (-> one Result per item).

        Every take of every item is a row of one decode loop; up to `max_rows` (default max_takes) rows run at
        once, each with its own prompt, position and end. Every `chunk_frames` frames, progress is reported
        (on_progress(frames_done, frames_total), the total an estimate) and finished rows free their slots
        for the next (longest text first). should_stop() -> True stops with GenerationInterrupted."""
        t0 = time.perf_counter()
        on_progress, should_stop = guarded("on_progress", on_progress), guarded("should_stop", should_stop)
        items, single = as_items(what, takes, seed, first_take, "generate")
        if not items:
            return []
        max_rows = self._max_rows(max_rows)
        checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS, "4 frames is typical.")
        rows, prompts, item_rows = self._rows(items, params)
        # Longest first, so the short rows fill the tail; an item's takes stay together (one prefill).
        order = [r for k in sorted(range(len(items)), key=lambda k: -rows[item_rows[k][0]].expected)
                 for r in item_rows[k]]
        slots = min(max_rows, len(rows))
        together = len(rows) <= slots and _shared_reference(rows)
        session = self._session([r.prompt.ref_codes for r in rows], together, stream=False)
        timings = {}
        chunks = decode_rows(self.runner, rows, slots=slots, params=(params or self.defaults).validate(),
                             eos_id=self.cfg.talker.codec_eos_id, chunk_frames=chunk_frames, order=order,
                             should_stop=should_stop, on_frames=on_progress, timings=timings, prelaunch=True,
                             ahead=1 if self.device.type == "cuda" else 0, on_admit=session.admit)
        codes, valid = [[] for _ in rows], [[] for _ in rows]
        slot_of = {}
        # The host memory of each item's audio is made resident while the frames run (host_audio.py).
        hosts = [HostAudio(len(mine), rows[mine[0]].max_frames) for mine in item_rows] \
            if together and self.device.type == "cuda" else []
        try:
            for chunk in touching(chunks, list(zip(item_rows, hosts))):
                session.push(chunk)
                for slot, r in enumerate(chunk.rows):
                    if r >= 0:
                        slot_of[r] = slot
                        codes[r].append(chunk.codes[slot])
                        valid[r].append(chunk.valid[slot])
            lengths = [int(n) for n in torch.stack([torch.cat(v).sum() for v in valid]).tolist()]
            codes = [torch.cat(c)[:n] for c, n in zip(codes, lengths)]
            t_decode = time.perf_counter()
            wav = session.finish()
        finally:
            session.release()
        audio = []
        for k, mine in enumerate(item_rows):
            frames = [lengths[r] for r in mine]
            if together:  # the batch's audio in slot order; an item's takes may sit anywhere in it
                slots_of = [slot_of[r] for r in mine]
                part = wav[: len(mine)] if slots_of == list(range(len(mine))) \
                    else wav[torch.tensor(slots_of, device=wav.device)]
            else:
                part = torch.zeros(len(mine), max(frames) * SAMPLES_PER_FRAME, device=self.device)
                for i, r in enumerate(mine):
                    part[i, : wav[r].shape[0]] = wav[r]
            audio.append(_trim(part, frames, hosts[k] if hosts else None))
        wall = time.perf_counter() - t0
        results = []
        for k, mine in enumerate(item_rows):
            n = [lengths[r] for r in mine]
            samples = [x * SAMPLES_PER_FRAME for x in n]
            stats = {"frames": max(n), "prompt_tokens": prompts[k].prefill.shape[1], "frames_per_take": n,
                     "prefill_s": timings.get("prefill_s", 0.0), "decode_s": t_decode - t0,
                     "codec_s": wall - (t_decode - t0), "wall_s": wall, "audio_s": max(samples) / SAMPLE_RATE,
                     "notes": prompts[k].notes, "batch": timings.get("batch", {}),
                     "codec": "batched" if together else "per row"}
            results.append(Result(audio=audio[k], lengths=samples, codes=[codes[r].cpu() for r in mine],
                                  stats=stats))
        return results[0] if single else results

    @serialised_stream
    @torch.inference_mode()
    def stream(self, what: Request | list, *, takes: int = 1, seed: int = 0, first_take: int = 0,
               params: SamplingParams | None = None, chunk_frames: int = 8, first_chunk_frames: int = 0,
               max_rows: int | None = None, on_progress=None, should_stop=None) -> Iterator[Chunk]:
        """Yield audio as it is made: a Chunk for each take of each item every `chunk_frames` frames. Each
        take's chunks, joined, equal that take of generate() with the same arguments.

        Rows enter in item order and up to `max_rows` (default max_takes) decode at once; a finished row frees
        its slot for the next at a chunk boundary. `first_chunk_frames` (1..chunk_frames, 0 = chunk_frames)
        makes the first chunk shorter for earlier first audio, and only item 0's takes are prefilled before
        it. Closing the generator early frees the engine."""
        on_progress, should_stop = guarded("on_progress", on_progress), guarded("should_stop", should_stop)
        items, _ = as_items(what, takes, seed, first_take, "stream")
        if not items:
            return
        max_rows = self._max_rows(max_rows)
        checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
        checks.whole_number("first_chunk_frames", first_chunk_frames, 0, chunk_frames,
                            "0 makes the first chunk as long as the others; 2 gives the earliest first audio.")
        t0 = time.perf_counter()
        rows, _, item_rows = self._rows(items, params)
        tag = [(k, i) for k, mine in enumerate(item_rows) for i in range(len(mine))]
        slots = min(max_rows, len(rows))
        lead = min(len(item_rows[0]), slots) if first_chunk_frames > 0 else 0
        together = len(rows) <= slots and lead in (0, len(rows)) and _shared_reference(rows)
        session = self._session([r.prompt.ref_codes for r in rows], together, stream=True, slots=slots)
        side = session.side
        chunks = decode_rows(self.runner, rows, slots=slots, params=(params or self.defaults).validate(),
                             eos_id=self.cfg.talker.codec_eos_id, chunk_frames=chunk_frames,
                             should_stop=should_stop, on_frames=on_progress, first_chunk_frames=first_chunk_frames,
                             lead_rows=lead, prelaunch=side is not None, ahead=STREAM_AHEAD if side is not None else 0,
                             on_admit=session.admit)
        count = [0] * len(rows)
        try:
            for chunk in chunks:
                for r, audio, codes, final in session.push(chunk):  # the consumer then runs on the main stream
                    k, i = tag[r]
                    yield Chunk(item=k, take=i, audio=audio, codes=codes, index=count[r], final=final,
                                elapsed_s=time.perf_counter() - t0)
                    count[r] += 1
        finally:
            chunks.close()  # the loop first, then the codec states it fed
            session.release()

    # -- voices --------------------------------------------------------------------------------

    @serialised()
    def extract_voice(self, waveform, sample_rate: int, ref_text: str | None = None) -> Voice:
        """Speaker embedding (and, with ref_text, ICL reference codes) from any mono or multi-channel audio."""
        return self.extract_voice_beside_decode(waveform, sample_rate, ref_text)

    @torch.inference_mode()
    def extract_voice_beside_decode(self, waveform, sample_rate: int, ref_text: str | None = None) -> Voice:
        """extract_voice without holding the engine, for a scheduler's caller while its loop decodes: it runs the
        speaker and codec encoders alone, never the decode loop's cache, graphs or codec decoder states."""
        from . import audio

        if self.speaker_encoder is None:
            raise ModeError(
                f"this is a {self.cfg.tts_model_type} checkpoint; only Base checkpoints can extract voices. "
                "Load a Qwen3-TTS-12Hz Base model for voice cloning."
            )
        checks.text_value("ref_text", ref_text, optional=True)
        if ref_text is not None and ref_text.strip():  # blank: no transcript, x-vector only
            checks.visible_text("ref_text", ref_text, REF_TEXT_HINT)
        wav24 = audio.prepare_reference(waveform, sample_rate, SAMPLE_RATE)
        emb = self.speaker_encoder.embed(wav24)
        codes = text = None
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
