"""The codec decoder as CUDA graphs over pieces of 32, 16, 8, 4, 2 and 1 frames: any length, no capture.

A chunked decode continues a `DecodeState` whose buffers have static shapes and are only written in
place (engine/codec/decoder.py), and the result equals one pass over all frames however the frames are
split. So any run of k frames is decoded as its binary pieces (k = 13: 8 + 4 + 1), each the replay of a
graph captured once at load. Whole utterances, streamed chunks of any size and the ICL reference prefix
all go through the same pieces: no length is ever compiled or captured while a request runs.

`CodecGraphs` keeps one state per batch bucket (1, 2, 4, 8, 16, as the frame graphs): a batch of 3 rows
runs in the bucket of 4 with a zero row (rows are independent, so the padding changes nothing). Because a
bucket has one shared state, one stream at a time may use it: `acquire` hands it to a codec session
(engine/codec_session.py) while no other owner holds it; a second, concurrent owner gets None and decodes eagerly on a
private state (still exact, just not graphed).

A slotted stream (engine/codec_session.py) decodes the rows it holds on a view of the first 1, 2, 4, ... rows of
its bucket's state (DecodeState.first_rows): each view has piece graphs of its own over the same buffers, so two
rows held in a 64-row state cost a two-row decode, and rows never move between states.

The ICL reference prefix is decoded once per (voice, bucket): the state after it is kept (a few MB) and
put back for the next request with the same reference codes, so no request re-decodes them.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref

import torch

from ..codec.decoder import CodecDecoder, DecodeState
from ..content_key import content_key
from ..kept import Kept
from .buckets import BATCH_BUCKETS, bucket_for
from .capture import capture as capture_graph

log = logging.getLogger(__name__)

PIECES = (32, 16, 8, 4, 2, 1)  # frames per captured graph; every length is a sum of these
PREFIXES_KEPT = 8  # ICL reference states kept (least recently used dropped first)


def pieces(frames: int) -> list[int]:
    """frames as a sum of PIECES, largest first (at most one of each size below the largest)."""
    out = []
    for size in PIECES:
        while frames >= size:
            out.append(size)
            frames -= size
    return out


def final_pieces(frames: int) -> list[int]:
    """The pieces of an utterance's last `frames` frames: whole largest pieces, then what is left as ONE
    piece, the smallest that holds it (padded with zero frames; nothing follows, so the state may run past
    the end)."""
    out = [PIECES[0]] * (frames // PIECES[0])
    rest = frames % PIECES[0]
    if rest:
        out.append(min(p for p in PIECES if p >= rest))
    return out


class CodecGraphs:
    """Owns the per-bucket decode states, the captured piece graphs and the ICL prefix states."""

    def __init__(self, decoder: CodecDecoder, capture: bool = True):
        self.decoder = decoder
        self.capture_enabled = capture  # False: same bookkeeping, every piece eager (CPU tests)
        self.states: dict[int, DecodeState] = {}
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.views: dict[tuple[int, int], DecodeState] = {}  # (bucket, rows) -> the view of its state's first rows
        self.view_graphs: dict[tuple[int, int, int], tuple] = {}  # (bucket, rows, frames) -> as in graphs
        self._places: dict[int, tuple[int, int]] = {}  # id of a shared state or view -> (bucket, rows)
        self.prefixes = Kept(PREFIXES_KEPT)  # (bucket, reference key) -> state snapshot
        self._owners: dict[int, weakref.ref] = {}
        self.pools: dict[int, tuple] = {}  # a graph pool per bucket: the load captures its buckets side by side
        self._lock = threading.Lock()  # the bookkeeping that capture threads share
        self.capture_seconds = 0.0  # summed over captures (threads side by side count each)
        self.late_captures = 0  # captures outside precapture(), i.e. while a request ran
        self.replays = 0
        self.eager_pieces = 0
        self.private_streams = 0  # streams that found their bucket's state busy and decoded eagerly
        self.failure: str | None = None  # first capture error; no capture is tried after one
        self._beside: _Beside | None = None  # precapture_beside's thread, until someone needs the graphs
        self.warm_buckets = ()  # the load's buckets (precapture_beside): smaller decodes use them (buckets.bucket_for)

    @property
    def captures(self) -> int:
        """Successful captures: one per (bucket, piece) and per (bucket, view, piece); a replayed piece never
        counts twice."""
        return len(self.graphs) + len(self.view_graphs)

    @property
    def prefix_hits(self) -> int:
        """ICL reference states found kept rather than decoded again."""
        return self.prefixes.hits

    def stats(self) -> dict:
        return {"captured": sorted(self.graphs), "views": sorted({k[:2] for k in self.view_graphs}),
                "captures": self.captures, "capture_s": self.capture_seconds,
                "late_captures": self.late_captures, "replays": self.replays, "eager_pieces": self.eager_pieces,
                "prefix_hits": self.prefix_hits, "prefixes": len(self.prefixes),
                "private_streams": self.private_streams, "failure": self.failure}

    def release(self) -> None:
        self.settle()
        self.graphs.clear()
        self.view_graphs.clear()
        self.views.clear()
        self.states.clear()
        self._places.clear()
        self.prefixes.clear()
        self._owners.clear()
        self.pools.clear()
        self.capture_enabled = False  # a decoder still holding a state keeps working, eagerly

    # -- states --------------------------------------------------------------------------------

    @torch.inference_mode()
    def state(self, bucket: int) -> DecodeState:
        """The shared state of `bucket` rows, every buffer allocated (outside any capture, on this stream)."""
        if bucket not in self.states:
            p = next(self.decoder.parameters())
            state = DecodeState()
            codes = torch.zeros(bucket, self.decoder.cfg.num_quantizers, 1, dtype=torch.long, device=p.device)
            self.decoder(codes, state, check=False)  # one frame allocates every tail, K/V and the position
            self.states[bucket] = state.zero_()
            self._places[id(state)] = (bucket, bucket)
        return self.states[bucket]

    def view(self, bucket: int, rows: int) -> DecodeState:
        """The first `rows` rows of `bucket`'s shared state (the state itself for rows == bucket)."""
        if rows == bucket:
            return self.state(bucket)
        key = (bucket, rows)
        if key not in self.views:
            self.views[key] = self.state(bucket).first_rows(rows)
            self._places[id(self.views[key])] = key
        return self.views[key]

    def acquire(self, batch: int, owner, views: bool = False) -> DecodeState | None:
        """The shared state of batch's bucket for `owner`, or None while another live owner holds it. views: the
        owner will decode on views of the state's first rows (a slotted stream), so their pieces are captured
        here too."""
        self.settle()
        bucket = self._bucket(batch)
        ref = self._owners.get(bucket)
        holder = ref() if ref is not None else None
        if holder is not None and holder is not owner:
            self.private_streams += 1
            log.info("codec graphs: the %d-row decode state is in use by another stream; decoding eagerly", bucket)
            return None
        # Every user of a bucket's state comes here before its request's first frame (or after its loop), so a
        # new row count's pieces are captured here, once, and never while frames run.
        self.precapture([bucket], views=views)
        state = self.state(bucket)
        self._owners[bucket] = weakref.ref(owner)  # freed with the owner (e.g. an exhausted Engine.stream)
        return state

    def release_owner(self, owner) -> None:
        """`owner` is done with the state it acquired (a no-op if it holds none)."""
        for bucket, ref in list(self._owners.items()):
            if ref() is owner:
                del self._owners[bucket]

    def precapture_slots(self, slots: int) -> None:
        """Capture what a slotted stream of `slots` slots decodes on (its bucket and the views of its first rows),
        as acquire(slots, owner, views=True) would before that stream's first frame (a scheduler calls this when
        it starts, so its first request pays no capture)."""
        self.settle()
        self.precapture([self._bucket(slots)], views=True)

    def _bucket(self, batch: int) -> int:
        """The bucket whose state `batch` rows decode in (buckets.bucket_for over what is captured)."""
        return bucket_for(batch, {b for b, _ in self.graphs}, self.warm_buckets)

    def bucket_holding(self, state: DecodeState) -> int | None:
        """The bucket whose shared state `state` is (None for a view or any other state)."""
        place = self._place(state)
        return place[0] if place is not None and place[0] == place[1] else None

    def _place(self, state: DecodeState) -> tuple[int, int] | None:
        """(bucket, rows) of a shared state or of a view of one; None for any other state. (The shared states and
        views live until release(), which forgets them all, so their ids are theirs alone.)"""
        return self._places.get(id(state))

    def _table(self, bucket: int, rows: int, frames: int) -> tuple[dict, tuple]:
        """Where the graph of `frames`-frame pieces on `rows` rows of `bucket`'s state is kept, and its key."""
        return (self.graphs, (bucket, frames)) if rows == bucket else (self.view_graphs, (bucket, rows, frames))

    # -- capture -------------------------------------------------------------------------------

    def precapture_beside(self, buckets) -> None:
        """Start precapture(buckets) on threads and return: at load it runs while the talker's weights are read
        (the codec's first eager frame, its library start-up and per-shape plans, and its captures are a large part
        of a load), each bucket on a thread of its own (_Beside).
        acquire, precapture and release wait for them."""
        self.warm_buckets = tuple(buckets)
        self._beside = _Beside(self, buckets)

    def settle(self) -> None:
        """Wait for precapture_beside's threads, if they run (and this is not one); an error is raised here."""
        beside = self._beside
        if beside is None or beside.is_running_here():
            return
        self._beside = None
        beside.join()

    @torch.inference_mode()
    def precapture(self, buckets, views: bool = False) -> None:
        """Capture every piece for each bucket (at load: a request never pays a capture); views: also for the
        views of the first 1, 2, 4, ... rows of the largest bucket's state."""
        self.settle()
        for bucket in buckets:
            for size in PIECES:
                self.capture(bucket, size)
        if views and buckets:
            top = max(buckets)
            for rows in (b for b in BATCH_BUCKETS if b < top):
                for size in PIECES:
                    self.capture(top, size, rows)

    @torch.inference_mode()
    def capture(self, bucket: int, frames: int, rows: int | None = None) -> bool:
        """Capture the graph for (bucket, frames), or for the view of `bucket`'s first `rows` rows, unless it
        exists; False if capture is off or failed."""
        rows = bucket if rows is None else rows
        table, key = self._table(bucket, rows, frames)
        if key in table:
            return True
        if not self.capture_enabled or self.failure is not None:
            return False
        t0 = time.perf_counter()
        root = self.state(bucket)
        state = self.view(bucket, rows)
        saved = root.snapshot()
        codes = torch.zeros(rows, self.decoder.cfg.num_quantizers, frames, dtype=torch.long,
                            device=root.frames.device)
        try:
            with torch.cuda.device(root.frames.device):  # the caller's current device may be another GPU
                with self._lock:
                    if bucket not in self.pools:
                        self.pools[bucket] = torch.cuda.graph_pool_handle()
                    pool = self.pools[bucket]
                graph, wav = capture_graph(lambda: self.decoder(codes, state, check=False), pool)
        except Exception as exc:  # noqa: BLE001  any failure: say so once, then decode eagerly
            self.failure = f"{type(exc).__name__}: {exc}"
            log.warning("codec CUDA graph capture failed (%d of %d rows, %d-frame pieces: %s); decoding eagerly",
                        rows, bucket, frames, self.failure)
            return False
        finally:
            root.restore(saved)  # the warm-up decodes must not advance the real state
        with self._lock:
            table[key] = (graph, codes, wav)
            self.capture_seconds += time.perf_counter() - t0
        return True

    # -- decoding ------------------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, state: DecodeState, final: bool = False) -> torch.Tensor:
        """codes [B, Q, k] -> audio [B, k * samples_per_frame], continuing `state`.

        On a bucket's shared state the k frames run as their pieces, each a graph replay (a piece with no
        graph is captured now if capture is on, else decoded eagerly on the same buffers); on any other
        state, eagerly in one call. `final`: these are the utterance's last frames, so the remainder after
        the whole largest pieces runs as one zero-padded piece (final_pieces); the state is then past the
        end, and its owner zeroes or primes it before the next utterance (acquire's callers all do).
        """
        batch, frames = codes.shape[0], codes.shape[-1]
        place = self._place(state)
        if place is None:
            self.eager_pieces += 1
            return self.decoder(codes, state, check=False)
        bucket, rows = place
        if rows > batch:  # zero rows: the codec's rows are independent, so they change nothing
            codes = torch.cat([codes, codes.new_zeros(rows - batch, *codes.shape[1:])])
        spf = self.decoder.samples_per_frame
        out = None
        start = 0
        for size in final_pieces(frames) if final else pieces(frames):
            real = min(size, frames - start)  # < size only for the padded last piece of a final decode
            wav = self._piece(bucket, rows, size, codes[..., start: start + real], state)
            if out is None:
                out = wav.new_empty(batch, frames * spf)
            out[:, start * spf: (start + real) * spf].copy_(wav[:batch, : real * spf])
            start += real
        return out

    def _piece(self, bucket: int, rows: int, size: int, codes: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Decode a `size`-frame piece on `rows` rows of `bucket`'s state; codes may hold fewer frames (the rest
        are zero frames)."""
        table, key = self._table(bucket, rows, size)
        if key not in table and self.capture_enabled and self.failure is None:
            self.late_captures += 1
            log.info("codec graphs: capturing %d-frame pieces for %d of %d rows during a request", size, rows, bucket)
            self.capture(bucket, size, rows)
        real = codes.shape[-1]
        entry = table.get(key)
        if entry is None:
            self.eager_pieces += 1
            if real < size:
                codes = torch.cat([codes, codes.new_zeros(*codes.shape[:-1], size - real)], -1)
            return self.decoder(codes, state, check=False)
        graph, static_codes, wav = entry
        static_codes[..., :real].copy_(codes)
        if real < size:
            static_codes[..., real:].zero_()
        graph.replay()
        self.replays += 1
        return wav  # static: the caller copies it out before the next replay

    @torch.inference_mode()
    def prime(self, state: DecodeState, ref_codes: torch.Tensor, batch: int) -> None:
        """Start a new utterance of `batch` rows on `state` after the ICL reference codes [R, Q] (left
        context, never emitted). On a shared state the state after the reference is kept and put back
        the next time the same codes come."""
        bucket = self.bucket_holding(state)
        codes = ref_codes.t()[None]
        if bucket is None:
            state.zero_()
            self.decode(codes.expand(batch, -1, -1).to(self._device()), state)
            return
        key = (bucket, content_key(ref_codes))
        saved = self.prefixes.get(key)
        if saved is not None:
            state.restore(saved)
            return
        state.zero_()
        self.decode(codes.expand(bucket, -1, -1).to(self._device()), state)
        self.prefixes.put(key, state.snapshot())

    @torch.inference_mode()
    def one_row_prefix(self, ref_codes: torch.Tensor) -> list[torch.Tensor]:
        """The one-row state after ICL reference codes [R, Q], as a snapshot (slotted streams start a row from
        it: DecodeState.start_row). Kept with the primed states of the one-row bucket (the same key), decoded
        eagerly on a private state the first time: the one-row bucket's state may be decoding a row now."""
        key = (1, content_key(ref_codes))
        saved = self.prefixes.get(key)
        if saved is None:
            saved = self.prefixes.put(key, self.decoder.state_after(ref_codes).buffers())
        return saved

    @torch.inference_mode()
    def decode_utterance(self, codes: torch.Tensor, ref_codes: torch.Tensor | None = None) -> torch.Tensor | None:
        """Whole-utterance decode of codes [B, T, Q] (frame-major) through the piece graphs, after the ICL
        reference codes [R, Q] if given: audio [B, T * samples_per_frame]. None when the bucket's state is
        held by a live stream (the caller then decodes eagerly)."""
        owner = _Owner()
        state = self.acquire(codes.shape[0], owner)
        if state is None:
            return None
        try:
            if ref_codes is not None:
                self.prime(state, ref_codes, codes.shape[0])
            else:
                state.zero_()
            return self.decode(codes.transpose(1, 2), state, final=True)
        finally:
            self.release_owner(owner)

    def _device(self):
        return next(self.decoder.parameters()).device


class _Owner:
    """A holder for acquire() during one synchronous whole-utterance decode."""


class _Beside:
    """CodecGraphs.precapture at load, on threads of their own, each on a stream of its own (their work is
    ordered after the work queued on the caller's stream so far, where the codec's weights were copied).

    The first thread decodes the first bucket's first eager frame, where the libraries start (cuDNN, cuBLAS,
    the snake kernel's load), then starts a second thread for the largest bucket and captures the others itself
    (the largest costs about as much as all the smaller ones together), so no single thread of captures is left
    as the load's last step. Two threads, not one a bucket: more captures at once fail on the GPU
    (cudaErrorStreamCaptureIsolation). Each bucket has its own graph pool: graphs captured at the same time
    must not share one."""

    def __init__(self, graphs: CodecGraphs, buckets):
        self.device = graphs._device()
        self.ready = torch.cuda.Event()
        self.ready.record(torch.cuda.current_stream(self.device))
        self.errors: list[BaseException] = []
        self.threads: list[tuple[threading.Thread, torch.cuda.Stream]] = []
        first, *rest = sorted(buckets)
        self._start(graphs, [first, *rest[:-1]], rest[-1:])

    def _start(self, graphs: CodecGraphs, buckets: list, then: list) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_event(self.ready)
        thread = threading.Thread(target=self._run, args=(graphs, buckets, then, stream), name="codec-precapture",
                                  daemon=True)
        self.threads.append((thread, stream))
        thread.start()

    def _run(self, graphs: CodecGraphs, buckets: list, then: list, stream: torch.cuda.Stream) -> None:
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                graphs.state(buckets[0])  # the libraries' start-up, once, before the other thread starts
                if then:
                    self._start(graphs, then, [])
                graphs.precapture(buckets)
        except BaseException as exc:  # noqa: BLE001  handed to the thread that joins
            self.errors.append(exc)

    def is_running_here(self) -> bool:
        return any(threading.current_thread() is t for t, _ in self.threads)

    def join(self) -> None:
        self.threads[0][0].join()  # the first thread starts the others before it ends: the list is whole now
        for thread, stream in self.threads:
            thread.join()
            torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.errors:
            raise self.errors[0]
